package sqscfg

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestQueueURLParsedOnce: WithDefaults parses the queue URL once for the
// name, the host and the checks; a URL changed afterwards is parsed anew,
// never answered from the old one.
func TestQueueURLParsedOnce(t *testing.T) {
	t.Parallel()
	c := Config{QueueURL: "https://sqs.eu-west-1.amazonaws.com/123456789012/jobs.fifo"}.WithDefaults()
	require.NotNil(t, c.queue)
	require.Equal(t, "sqs:jobs.fifo", c.Name())
	require.Equal(t, "sqs.eu-west-1.amazonaws.com", c.Host())
	require.NoError(t, c.Validate())

	c.QueueURL = "http://127.0.0.1:4566/000000000000/other.fifo"
	require.Equal(t, "sqs:other.fifo", c.Name(), "a changed URL is not read from the old parse")
	require.Equal(t, "127.0.0.1:4566", c.Host())

	bad := Config{QueueURL: "::not a url"}.WithDefaults()
	require.ErrorContains(t, bad.Validate(), "not an http or https URL")
	require.Empty(t, bad.Host())
}
