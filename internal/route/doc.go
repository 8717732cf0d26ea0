// Package route is the wire protocol of a live broker migration, shared by
// the relay that writes it, the workers and the bridge that read it, and
// package migration's controller: the slice of an aggregate, the steps of
// a plan and the copies they route an event to, the route stamp every
// record of a migration carries (HeaderRoute) and the fences the relay
// writes at each step (HeaderFence). Users see none of it: package
// migration holds the plan, its phases and the controller.
package route
