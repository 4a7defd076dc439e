package projection

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/app/sqsemu"
	"github.com/projector/projector/source/sqs/sqscfg"
)

// emulatorSQS is the configuration of a queue on the emulator, with
// short timings for tests.
func emulatorSQS(e *sqsemu.Emulator, queueURL string, visibility time.Duration) SQS {
	return SQS{
		QueueURL: queueURL, Endpoint: e.Endpoint, Region: sqsemu.Region, Wait: time.Second, Visibility: visibility,
		Credentials: &sqscfg.Credentials{AccessKeyID: sqsemu.AccessKey, SecretAccessKey: sqsemu.SecretKey},
	}.WithDefaults()
}

var sendSeq atomic.Int64

// sendSQS sends each value to queueURL with its group id, and a
// deduplication id of its own, so that a value sent twice arrives twice.
func sendSQS(t testing.TB, e *sqsemu.Emulator, queueURL string, groupValues ...string) {
	t.Helper()
	c := e.Client()
	for i := 0; i+1 < len(groupValues); i += 2 {
		_, err := c.SendMessage(t.Context(), &sqs.SendMessageInput{QueueUrl: aws.String(queueURL),
			MessageGroupId: aws.String(groupValues[i]), MessageBody: aws.String(groupValues[i+1]),
			MessageDeduplicationId: aws.String(fmt.Sprint(sendSeq.Add(1)))})
		require.NoError(t, err)
	}
}
