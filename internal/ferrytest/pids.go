package ferrytest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// KafkaBrokerPID is the stack's Kafka broker (cluster A), from the pid
// file scripts/stack keeps in FERRY_STACK_DIR; 0 when it is not known.
func KafkaBrokerPID() int {
	if os.Getenv(EnvStackDir) == "" {
		return 0
	}
	return pidFile(filepath.Join(os.Getenv(EnvStackDir), "kafka", "kafka.pid"))
}

// RabbitMQPID is the stack's RabbitMQ node (its beam.smp), from
// FERRY_TEST_RABBITMQ_PID_FILE; 0 when it is not known.
func RabbitMQPID() int {
	if os.Getenv(EnvRabbitMQPIDFile) == "" {
		return 0
	}
	return pidFile(os.Getenv(EnvRabbitMQPIDFile))
}

func pidFile(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}
