package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/projector/projector/internal/app/sqsemu"
	"github.com/projector/projector/internal/testkit/pgtest"
	"github.com/projector/projector/internal/testkit/sqstest"
	"github.com/projector/projector/projection"
	"github.com/projector/projector/store"
)

// TestRunSQSUsageErrors: wrong or missing SQS flags exit 2 with one line
// naming the flag to fix.
func TestRunSQSUsageErrors(t *testing.T) {
	t.Parallel()
	url := "--sqs-queue-url=https://sqs.eu-west-1.amazonaws.com/1/q.fifo"
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"no queue url", []string{"run", "--source", "sqs"}, []string{"--sqs-queue-url", "required with --source sqs"}},
		{"unknown source", []string{"run", "--source", "rabbit"}, []string{"--source \"rabbit\"", "kafka or sqs"}},
		{"queue url not a URL", []string{"run", "--source", "sqs", "--sqs-queue-url", "jobs.fifo"}, []string{"--sqs-queue-url \"jobs.fifo\""}},
		{"max messages above 10", []string{"run", "--source", "sqs", url, "--sqs-max-messages", "11"}, []string{"--sqs-max-messages 11", "1 to 10"}},
		{"max messages 0", []string{"run", "--source", "sqs", url, "--sqs-max-messages", "0"}, []string{"--sqs-max-messages 0", "1 to 10"}},
		{"wait above 20s", []string{"run", "--source", "sqs", url, "--sqs-wait", "30s"}, []string{"--sqs-wait 30s", "0s to 20s"}},
		{"visibility 0", []string{"run", "--source", "sqs", url, "--sqs-visibility", "0s"}, []string{"--sqs-visibility 0s", "1s to 12h"}},
		{"two problems", []string{"run", "--source", "sqs", url, "--sqs-wait", "1.5s", "--sqs-max-messages", "11"}, []string{"--sqs-wait 1.5s", "; --sqs-max-messages 11"}},
		{"endpoint not a URL", []string{"run", "--source", "sqs", url, "--sqs-endpoint", "localhost:4566"}, []string{"--sqs-endpoint \"localhost:4566\""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runBin(t, 20*time.Second, dbEnv(), tc.args...)
			require.Equal(t, 2, r.code, "%s", r)
			ls := lines(r.stderr)
			require.LessOrEqual(t, len(ls), 2, "%s", r)
			require.True(t, strings.HasPrefix(ls[0], "projector run: "), "%s", r)
			for _, w := range tc.want {
				require.Contains(t, ls[0], w, "%s", r)
			}
		})
	}
}

// TestRunSQS runs the daemon on an SQS queue of the emulator: it needs no
// brokers, projects every message, deletes them all, is ready, and shows
// the queue in /status and /metrics; SIGTERM stops it with exit 0.
func TestRunSQS(t *testing.T) {
	t.Parallel()
	e := sqstest.New(t)
	queue := sqstest.Queue(t, e, 5*time.Second)
	schema := pgtest.Schema(t)
	env := dbEnv("AWS_ACCESS_KEY_ID="+sqsemu.AccessKey, "AWS_SECRET_ACCESS_KEY="+sqsemu.SecretKey,
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
	p := startBin(t, "run", env, "run", "--source", "sqs", "--sqs-queue-url", queue, "--sqs-endpoint", e.Endpoint,
		"--sqs-region", sqsemu.Region, "--sqs-wait", "1s", "--schema", schema, "--http-addr", "127.0.0.1:0",
		"--log-format", "json", "--batch-linger", "10ms")
	addr := p.httpAddr(15 * time.Second)

	c := e.Client()
	send := func(group, body string) {
		_, err := c.SendMessage(t.Context(), &sqs.SendMessageInput{QueueUrl: aws.String(queue), MessageGroupId: aws.String(group),
			MessageBody: aws.String(body), MessageDeduplicationId: aws.String(fmt.Sprint(time.Now().UnixNano()))})
		require.NoError(t, err)
	}
	for i := range 20 {
		id := fmt.Sprintf("job-%d", i)
		send(id, fmt.Sprintf(`{"job_id":%q,"version":1,"kind":"snapshot","state":{"n":0}}`, id))
		send(id, fmt.Sprintf(`{"job_id":%q,"version":2,"kind":"delta","ops":[{"op":"increment","path":"/n","by":%d}]}`, id, i))
	}
	send("job-0", `{"job_id":"job-0","version":1,"kind":"snapshot","state":{"n":0}}`) // stale
	send("bad", `not json`)

	var st *liveStatus
	eventually(t, 30*time.Second, "every message projected", func() (bool, string) {
		p.requireAlive()
		var err error
		if st, err = fetchStatus(addr); err != nil {
			return false, err.Error()
		}
		return st.Counters.Consumed == 42, fmt.Sprintf("%+v", st.Counters)
	})
	require.True(t, st.Ready)
	require.Equal(t, int64(1), st.Counters.Stale)
	require.Equal(t, int64(1), st.Counters.Quarantined)
	code, body, err := get(addr, "/readyz")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code, "%s", body)
	require.Contains(t, string(body), "queue")
	// Messages are deleted after their batch committed, and the queue's
	// counts are read every 5 s: both follow the counters.
	eventually(t, 15*time.Second, "every message deleted and the queue seen empty", func() (bool, string) {
		_, body, err := get(addr, "/metrics")
		if err != nil {
			return false, err.Error()
		}
		for _, m := range []string{`projector_sqs_messages_total{event="deleted"} 42`, `projector_sqs_messages_total{event="received"} 42`,
			`projector_sqs_queue_messages{state="visible"} 0`, `projector_sqs_queue_messages{state="in_flight"} 0`,
			`projector_partition_lag{partition="0"} 0`,
			// The queue's name stands for the topic; SQS has no group.
			fmt.Sprintf(`projector_info{group="",schema=%q,table="jobs",topic=%q} 1`, schema, "sqs:"+queue[strings.LastIndexByte(queue, '/')+1:])} {
			if !strings.Contains(string(body), m) {
				return false, "no " + m
			}
		}
		return true, ""
	})
	n, err := c.GetQueueAttributes(t.Context(), &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queue),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	require.NoError(t, err)
	for k, v := range n.Attributes {
		require.Equal(t, "0", v, "%s", k)
	}

	st2, err := store.New(pgtest.Pool(t), store.Config{Schema: schema})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	rows, err := st2.Jobs(ctx)
	require.NoError(t, err)
	require.Len(t, rows, 20)
	require.JSONEq(t, `{"n":7}`, string(rows["job-7"].State))
	p.stop(stopWithin)

	// projector status reports the queue's counts as the lag, and the SQS
	// message of the quarantined record.
	r := runBin(t, 20*time.Second, env, "status", "--schema", schema, "--json", "--sqs-queue-url", queue,
		"--sqs-endpoint", e.Endpoint, "--sqs-region", sqsemu.Region)
	require.Equal(t, 0, r.code, "%s", r)
	var rep statusReport
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), "%s", r)
	require.NotNil(t, rep.SQS, "%s", r.stdout)
	require.Equal(t, projection.SQSCounts{}, rep.SQS.SQSCounts)
	require.NotNil(t, rep.Lag)
	require.Zero(t, *rep.Lag)
	require.Equal(t, 1, rep.Quarantine)
	require.NotEmpty(t, rep.Recent[0].MessageID, "%s", r.stdout)
	require.NotEmpty(t, rep.Recent[0].SequenceNumber, "%s", r.stdout)
	r = runBin(t, 20*time.Second, env, "status", "--schema", schema, "--sqs-queue-url", queue,
		"--sqs-endpoint", e.Endpoint, "--sqs-region", sqsemu.Region)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "0 visible, 0 in flight")
	require.Contains(t, r.stdout, "message "+rep.Recent[0].MessageID)
}

// TestRunSQSRefusedCredentials: SQS refusing the credentials stops run
// with exit 1 and a message saying what to fix, as brokers refusing them
// do, instead of retrying forever as an outage.
func TestRunSQSRefusedCredentials(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-amzn-query-error", "InvalidClientTokenId;Sender")
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"__type":"com.amazon.coral.service#UnrecognizedClientException","message":"The security token included in the request is invalid."}`))
	}))
	t.Cleanup(srv.Close)
	env := dbEnv("AWS_ACCESS_KEY_ID=AKIDWRONG", "AWS_SECRET_ACCESS_KEY=wrong",
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null")
	r := runBin(t, 60*time.Second, env, "run", "--source", "sqs", "--sqs-queue-url", srv.URL+"/000000000000/jobs.fifo",
		"--sqs-endpoint", srv.URL, "--sqs-region", "us-east-1", "--sqs-wait", "0s", "--schema", pgtest.Schema(t),
		"--http-addr", "127.0.0.1:0")
	require.Equal(t, 1, r.code, "%s", r)
	require.Contains(t, r.stderr, "credentials refused (InvalidClientTokenId)", "%s", r)
	require.Contains(t, r.stderr, "fix the AWS credentials", "%s", r)
}

// TestStatusSQSFlags: status takes the flags that name and reach a queue,
// not the receive settings of run, which it would ignore.
func TestStatusSQSFlags(t *testing.T) {
	t.Parallel()
	r := runBin(t, 20*time.Second, dbEnv(), "status", "--help")
	require.Equal(t, 0, r.code, "%s", r)
	for _, f := range []string{"--sqs-queue-url", "--sqs-endpoint", "--sqs-region"} {
		require.Contains(t, r.stdout, f)
	}
	for _, f := range []string{"--sqs-wait", "--sqs-visibility", "--sqs-max-messages", "with --source sqs"} {
		require.NotContains(t, r.stdout, f)
	}
	r = runBin(t, 20*time.Second, dbEnv(), "status", "--sqs-queue-url", "https://sqs.eu-west-1.amazonaws.com/1/q.fifo", "--sqs-wait", "1s")
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, r.stderr, "sqs-wait")
}
