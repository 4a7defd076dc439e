package bench

// The bench reads from Kafka: its source registers itself when linked in.
import _ "github.com/projector/projector/source/kafka"
