package cli

import (
	"strings"
	"testing"
)

// sqs:// and sns:// refuse, at start and in one line, what they cannot use:
// credentials in the URL (not shown), unknown parameters, an SNS target
// without its topic ARN.
func TestBrokerAWSFlagErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--broker", "sqs://AKIAHUNTER2:hunter2@queue?region=us-east-1"}, "credentials are not taken from the URL"},
		{[]string{"--broker", "sqs://?region=us-east-1&token=hunter2"}, "unknown or repeated query parameter"},
		{[]string{"--broker", "sqs://?endpoint=ftp://host"}, "?endpoint= must be an http(s) URL"},
		{[]string{"--broker", "sqs://q.fifo/path"}, "the destination goes in --topic-template"},
		{[]string{"--broker", "sqs://q.fifo", "--topic-template", "other.fifo"}, "give the destination once"},
		{[]string{"--broker", "sns://?region=us-east-1"}, "--topic-template is required for SNS"},
	}
	for _, tc := range cases {
		_, errOut, code := run(t, append([]string{"relay", "--database-url", "postgres://x@127.0.0.1:1/db"}, tc.args...)...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Count(errOut, "\n") != 1 || strings.Contains(errOut, "hunter2") {
			t.Errorf("relay %v: exit %d, stderr %q, want one line with %q", tc.args, code, errOut, tc.want)
		}
	}
}
