package sqs

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	snstypes "github.com/aws/aws-sdk-go-v2/service/sns/types"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/pgoutbox/pgoutbox/broker"
)

// New returns a Publisher to the SQS queues cfg.Destination names, through
// client (made with the AWS default credential chain, as config.LoadDefaultConfig
// does). A destination without placeholders is checked at once: it must
// exist and be FIFO (unless cfg.AllowStandard).
func New(ctx context.Context, client *awssqs.Client, cfg *Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("sqs: nil SQS client")
	}
	return newPublisher(ctx, sqsService{client}, cfg, DefaultQueue)
}

// NewSNS returns a Publisher to the SNS topics cfg.Destination names (topic
// ARNs; required), through client. A destination without placeholders is
// checked at once: it must exist and be FIFO (unless cfg.AllowStandard).
func NewSNS(ctx context.Context, client *awssns.Client, cfg *Config) (*Publisher, error) {
	if client == nil {
		return nil, errors.New("sqs: nil SNS client")
	}
	return newPublisher(ctx, snsService{client}, cfg, "")
}

type sqsService struct{ c *awssqs.Client }

func (sqsService) name() string { return "SQS queue" }

func (s sqsService) resolve(ctx context.Context, destination string) (string, bool, error) {
	addr := destination
	if isURL(destination) {
		if _, err := url.Parse(destination); err != nil {
			return "", false, broker.Misconfigured(fmt.Errorf("sqs: queue URL %.80q: %w", destination, err))
		}
	} else {
		out, err := s.c.GetQueueUrl(ctx, &awssqs.GetQueueUrlInput{QueueName: aws.String(destination)})
		if err != nil {
			return "", false, classify(fmt.Sprintf("queue %q", destination), err)
		}
		addr = aws.ToString(out.QueueUrl)
	}
	out, err := s.c.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(addr),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameFifoQueue}})
	if err != nil {
		return "", false, classify(fmt.Sprintf("queue %q", destination), err)
	}
	return addr, out.Attributes[string(sqstypes.QueueAttributeNameFifoQueue)] == "true", nil
}

// check refuses what is neither a queue URL nor a queue name: 1 to 80
// letters, digits, '-' and '_', then ".fifo" for a FIFO queue.
func (sqsService) check(destination string) error {
	if isURL(destination) {
		return checkPrintable(destination)
	}
	name := strings.TrimSuffix(destination, ".fifo")
	if len(name) == 0 || len(name) > 80 || strings.ContainsFunc(name, func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && r != '-' && r != '_'
	}) {
		return fmt.Errorf("queue name %.100q: want 1 to 80 letters, digits, '-' and '_' (and .fifo)", destination)
	}
	return nil
}

func (s sqsService) send(ctx context.Context, addr string, entries []entry) ([]error, error) {
	in := &awssqs.SendMessageBatchInput{QueueUrl: aws.String(addr), Entries: make([]sqstypes.SendMessageBatchRequestEntry, len(entries))}
	for i, e := range entries {
		in.Entries[i] = sqstypes.SendMessageBatchRequestEntry{Id: aws.String(batchID(i)), MessageBody: aws.String(e.body),
			MessageAttributes: stringAttrs(e, func(v *string) sqstypes.MessageAttributeValue {
				return sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: v}
			}),
			MessageGroupId: optional(e.group), MessageDeduplicationId: optional(e.dedup)}
	}
	out, err := s.c.SendMessageBatch(ctx, in)
	if err != nil {
		return nil, classify("SendMessageBatch", err)
	}
	return batchResults(len(entries), out.Successful, func(r sqstypes.SendMessageBatchResultEntry) *string { return r.Id },
		out.Failed, func(f sqstypes.BatchResultErrorEntry) batchFailure {
			return batchFailure{aws.ToString(f.Id), aws.ToString(f.Code), aws.ToString(f.Message), f.SenderFault}
		}), nil
}

func (s sqsService) ping(ctx context.Context) error {
	_, err := s.c.ListQueues(ctx, &awssqs.ListQueuesInput{MaxResults: aws.Int32(1)})
	return classify("ListQueues", err)
}

type snsService struct{ c *awssns.Client }

func (snsService) name() string { return "SNS topic" }

func (s snsService) resolve(ctx context.Context, destination string) (string, bool, error) {
	out, err := s.c.GetTopicAttributes(ctx, &awssns.GetTopicAttributesInput{TopicArn: aws.String(destination)})
	if err != nil {
		return "", false, classify(fmt.Sprintf("topic %q", destination), err)
	}
	return destination, out.Attributes["FifoTopic"] == "true", nil
}

// check refuses what cannot be a topic ARN: SNS names topics by ARN only.
func (snsService) check(destination string) error {
	if !strings.HasPrefix(destination, "arn:") {
		return fmt.Errorf("topic %.100q: want a topic ARN (arn:aws:sns:region:account:name)", destination)
	}
	return checkPrintable(destination)
}

// checkPrintable refuses a URL or ARN that is empty, too long, or holds
// characters outside printable ASCII.
func checkPrintable(d string) error {
	if len(d) > 1024 || !idChars(d) {
		return fmt.Errorf("destination %.100q: want at most 1024 printable ASCII characters without spaces", d)
	}
	return nil
}

func (s snsService) send(ctx context.Context, addr string, entries []entry) ([]error, error) {
	in := &awssns.PublishBatchInput{TopicArn: aws.String(addr), PublishBatchRequestEntries: make([]snstypes.PublishBatchRequestEntry, len(entries))}
	for i, e := range entries {
		in.PublishBatchRequestEntries[i] = snstypes.PublishBatchRequestEntry{Id: aws.String(batchID(i)), Message: aws.String(e.body),
			MessageAttributes: stringAttrs(e, func(v *string) snstypes.MessageAttributeValue {
				return snstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: v}
			}),
			MessageGroupId: optional(e.group), MessageDeduplicationId: optional(e.dedup)}
	}
	out, err := s.c.PublishBatch(ctx, in)
	if err != nil {
		return nil, classify("PublishBatch", err)
	}
	return batchResults(len(entries), out.Successful, func(r snstypes.PublishBatchResultEntry) *string { return r.Id },
		out.Failed, func(f snstypes.BatchResultErrorEntry) batchFailure {
			return batchFailure{aws.ToString(f.Id), aws.ToString(f.Code), aws.ToString(f.Message), f.SenderFault}
		}), nil
}

func (s snsService) ping(ctx context.Context) error {
	_, err := s.c.ListTopics(ctx, &awssns.ListTopicsInput{})
	return classify("ListTopics", err)
}

// batchFailure is one failed entry of a batch answer.
type batchFailure struct {
	id, code, message string
	senderFault       bool
}

// optional is s, or nil when empty (the parameter left out).
func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// stringAttrs maps e's attributes onto a service's attribute type.
func stringAttrs[V any](e entry, attr func(v *string) V) map[string]V {
	m := make(map[string]V, len(e.attrs))
	for k, v := range e.attrs {
		m[k] = attr(aws.String(v))
	}
	return m
}

// batchResults maps a batch answer (its successful entries, each with an id,
// and its failed ones) onto one result per entry: an entry the answer names
// in neither list gets an error, as it may not be stored.
func batchResults[S, F any](n int, ok []S, okID func(S) *string, failed []F, failure func(F) batchFailure) []error {
	res := make([]error, n)
	for i := range res {
		res[i] = errors.New("sqs: the batch answer names no result for this entry")
	}
	index := func(id string) int {
		i, err := strconv.Atoi(id)
		if err != nil || i < 0 || i >= n || batchID(i) != id {
			return -1
		}
		return i
	}
	for _, r := range ok {
		if i := index(aws.ToString(okID(r))); i >= 0 {
			res[i] = nil
		}
	}
	for _, r := range failed {
		f := failure(r)
		if i := index(f.id); i >= 0 {
			res[i] = classifyEntry(f)
		}
	}
	return res
}
