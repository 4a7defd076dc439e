package projection

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEngineLinksNoSource: the engine names no source, so neither Kafka's
// client library nor the AWS SDK is among what it links: sources are built
// outside it and handed in, or registered by the programs that link them.
func TestEngineLinksNoSource(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	require.NoError(t, err, "go list: %s", out)
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/segmentio/kafka-go", "github.com/aws/", "github.com/projector/projector/source/kafka", "github.com/projector/projector/source/sqs"} {
			if dep == banned || strings.HasPrefix(dep, banned+"/") || strings.HasPrefix(dep, banned) && strings.HasSuffix(banned, "/") {
				if dep == "github.com/projector/projector/source/kafka/kafkacfg" || dep == "github.com/projector/projector/source/sqs/sqscfg" {
					continue // plain settings, no client library
				}
				t.Errorf("the engine links %s", dep)
			}
		}
	}
}
