package sqstest

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// TestEmulatorFIFOSemantics pins the emulator's FIFO behaviour that the
// SQS source's tests rely on, and the differences from SQS that
// docs/guide/sqs.md lists: a message group is locked while one of its
// messages is in flight, content-based deduplication drops a resend,
// an undeleted message comes back after its visibility timeout, and every
// message carries its group id and sequence number.
func TestEmulatorFIFOSemantics(t *testing.T) {
	e := New(t)
	// 3 s: long enough that a loaded machine does not see group a's head
	// come back before the second receive.
	url := Queue(t, e, 3*time.Second)
	c := e.Client()
	ctx := t.Context()
	send := func(group, body string) string {
		t.Helper()
		out, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(url), MessageBody: aws.String(body), MessageGroupId: aws.String(group)})
		if err != nil {
			t.Fatal(err)
		}
		return aws.ToString(out.SequenceNumber)
	}
	s1 := send("a", `{"n":1}`)
	send("a", `{"n":1}`) // the same content: deduplicated
	send("a", `{"n":2}`)
	send("b", `{"n":3}`)
	if s1 == "" {
		t.Fatal("SendMessage returned no sequence number")
	}
	receive := func() []types.Message {
		t.Helper()
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(url), MaxNumberOfMessages: 10,
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll}})
		if err != nil {
			t.Fatal(err)
		}
		return out.Messages
	}
	first := receive()
	if len(first) == 0 {
		t.Fatal("no message received")
	}
	bodies := map[string]bool{}
	for _, m := range first {
		bodies[aws.ToString(m.Body)] = true
		if m.Attributes["MessageGroupId"] == "" || m.Attributes["SequenceNumber"] == "" {
			t.Fatalf("message %s lacks its group id or sequence number: %v", aws.ToString(m.MessageId), m.Attributes)
		}
	}
	if bodies[`{"n":2}`] && !bodies[`{"n":1}`] {
		t.Fatalf("group a's second message came before its first: %v", bodies)
	}
	// While group a's head is in flight nothing of group a is handed out.
	for _, m := range receive() {
		if m.Attributes["MessageGroupId"] == "a" {
			t.Fatalf("group a handed out %s while its head was in flight", aws.ToString(m.Body))
		}
	}
	// Delete group b's and leave group a's head undeleted: it comes back
	// after the visibility timeout, before group a's second message.
	for _, m := range first {
		if m.Attributes["MessageGroupId"] == "b" {
			if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	var again []types.Message
	for len(again) == 0 && time.Now().Before(deadline) {
		again = receive()
		if len(again) == 0 {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if len(again) == 0 || aws.ToString(again[0].Body) != `{"n":1}` {
		t.Fatalf("after the visibility timeout got %v, want group a's undeleted head {\"n\":1} again", again)
	}
	if n := again[0].Attributes["ApproximateReceiveCount"]; n != "2" {
		t.Errorf("ApproximateReceiveCount %q, want 2", n)
	}
	// Deleting the head lets the group move on; the resend was dropped.
	if _, err := c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: again[0].ReceiptHandle}); err != nil {
		t.Fatal(err)
	}
	var rest []string
	for range 3 {
		for _, m := range receive() {
			rest = append(rest, aws.ToString(m.Body))
			_, _ = c.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(url), ReceiptHandle: m.ReceiptHandle})
		}
	}
	if len(rest) != 1 || rest[0] != `{"n":2}` {
		t.Fatalf("after the head was deleted got %v, want only {\"n\":2} (the resend of {\"n\":1} deduplicated)", rest)
	}
}

func TestQueueNamesAreValid(t *testing.T) {
	if got := queueName("TestX/sub case.1"); got != "TestX_sub_case_1" {
		t.Fatalf("queueName = %q", got)
	}
}
