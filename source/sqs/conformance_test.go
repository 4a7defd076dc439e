package sqs_test

import (
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/projector/projector/internal/app/sqsemu"
	"github.com/projector/projector/internal/testkit/sqstest"
	"github.com/projector/projector/source/sourcetest"
	"github.com/projector/projector/source/sqs"
	"github.com/projector/projector/source/sqs/sqscfg"
)

// conformanceVisibility is the queues' visibility timeout unless a case
// asks for a redelivery: far longer than the suite waits for records, so
// that a message comes back in time only when the reader released it,
// never because its timeout ran out.
const conformanceVisibility = 5 * time.Minute

var dedup atomic.Int64

// TestConformance runs the source conformance suite against queue lanes
// on the fauxqs emulator, reached over TCP by the AWS SDK through a proxy
// the suite can cut: a FIFO queue per case.
func TestConformance(t *testing.T) {
	e := sqstest.New(t)
	emu, err := url.Parse(e.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	sourcetest.Run(t, sourcetest.Harness{
		Features: sourcetest.Features{OrderScope: sourcetest.OrderGroup, Shared: true, Outage: true},
		New: func(t *testing.T, o sourcetest.Options) sourcetest.Env {
			visibility := conformanceVisibility
			if o.Redelivery > 0 {
				visibility = o.Redelivery
			}
			queue := sqstest.Queue(t, e, visibility)
			link := sourcetest.NewLink(t)
			cfg := sqs.Config{
				QueueURL: queue, Endpoint: "http://" + link.Proxy(t, emu.Host), Region: sqsemu.Region,
				Wait: time.Second, Visibility: visibility,
				Credentials: &sqscfg.Credentials{AccessKeyID: sqsemu.AccessKey, SecretAccessKey: sqsemu.SecretKey},
			}.WithDefaults()
			c, err := sqs.Connect(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			log := slog.New(slog.NewTextHandler(io.Discard, nil))
			lane := sqs.NewLane(cfg.Name(), sqs.NewReader(c, log, o.BatchSize), o.BatchSize, 20*time.Millisecond)
			// Records are sent straight to the emulator, not through the
			// link: a cut link cuts the reader only.
			client := e.Client()
			return sourcetest.Env{
				Lane: lane,
				Link: link,
				Produce: func(t *testing.T, msgs ...sourcetest.Message) {
					t.Helper()
					for _, m := range msgs {
						_, err := client.SendMessage(t.Context(), &awssqs.SendMessageInput{QueueUrl: aws.String(queue),
							MessageGroupId: aws.String(m.Key), MessageBody: aws.String(m.Value),
							MessageDeduplicationId: aws.String(fmt.Sprint(dedup.Add(1)))})
						if err != nil {
							t.Fatalf("send to %s: %v", queue, err)
						}
					}
				},
			}
		},
	})
}
