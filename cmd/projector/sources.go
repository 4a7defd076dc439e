package main

// The sources this program offers (--source): each registers itself with
// the engine's source registry when linked in.
import (
	_ "github.com/projector/projector/source/kafka"
	_ "github.com/projector/projector/source/sqs"
)
