package rawsock

import (
	"os"
	"syscall"
	"time"
	"unsafe"
)

// Timer puts a goroutine to sleep on a timerfd that the network poller
// waits on, its calls raw (see the package's doc).
//
// A Go timer (time.Sleep, a deadline) that is the next thing a sleeping
// process waits for wakes it twice: the poller's epoll_wait takes its
// timeout in whole milliseconds, rounded down, so it returns before the
// timer is due and sleeps once more, a millisecond at least; and the
// runtime's monitor thread, asleep until that same timer, wakes for it on
// its own. A timerfd is due when the kernel's clock says so, to the
// nanosecond: the poller returns once, when it is.
type Timer struct {
	f   *os.File
	raw syscall.RawConn
}

// NewTimer returns a Timer; Close releases it.
func NewTimer() (*Timer, error) {
	const clockMonotonic = 1
	fd, _, errno := syscall.RawSyscall(syscall.SYS_TIMERFD_CREATE, clockMonotonic, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return nil, os.NewSyscallError("timerfd_create", errno)
	}
	f := os.NewFile(fd, "timerfd") // non-blocking: the poller waits on it
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Timer{f: f, raw: raw}, nil
}

// Sleep returns after d, or at once with an error when the timer cannot be
// set or was closed. One goroutine sleeps on a Timer at a time.
func (t *Timer) Sleep(d time.Duration) error {
	if d <= 0 {
		return nil
	}
	// struct itimerspec: it_interval (none: fires once), then it_value.
	spec := [4]int64{0, 0, int64(d / time.Second), int64(d % time.Second)}
	var errno syscall.Errno
	err := t.raw.Control(func(fd uintptr) {
		_, _, errno = syscall.RawSyscall6(syscall.SYS_TIMERFD_SETTIME, fd, 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0)
	})
	if err == nil && errno != 0 {
		err = os.NewSyscallError("timerfd_settime", errno)
	}
	if err != nil {
		return err
	}
	var expirations uint64
	err = t.raw.Read(func(fd uintptr) bool {
		for {
			_, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&expirations)), unsafe.Sizeof(expirations))
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // not due yet: wait in the poller
			}
			errno = e
			return true
		}
	})
	if err == nil && errno != 0 {
		err = os.NewSyscallError("read timerfd", errno)
	}
	return err
}

// Close releases the timer; a Sleep under way returns an error.
func (t *Timer) Close() error { return t.f.Close() }
