// llmd-harness runs llm-d's KV-cache indexer (github.com/llm-d/llm-d-kv-cache, pinned in go.mod) on the KV
// events of kvpool masters, and answers score queries for prompts given as token ids. It is the llm-d
// peer of kvpool's peer suite (python/peer_tests/llm-d, docs/engines.md "Routers").
//
// Everything that touches the events is llm-d's own code, wired the way llm-d's example service wires it
// (examples/kv_events/online in that module):
//
//   - llm-d's ZMQ subscriber (kvevents.SubscriberManager.EnsureSubscriber: a SUB socket of the pure-Go
//     github.com/go-zeromq/zmq4, which llm-d itself uses; no libzmq, no cgo) connects to each master's
//     --kv-events-endpoint;
//   - llm-d's vLLM adapter (engineadapter.VLLMAdapter) decodes each msgpack EventBatch, array- or
//     map-shaped, and takes the pod and the model from the topic "kv@POD@MODEL";
//   - llm-d's sharded events pool (kvevents.Pool) applies BlockStored / BlockRemoved / AllBlocksCleared
//     to llm-d's in-memory block index (kvblock.InMemoryIndex), recomputing its own block keys from the
//     events' token ids with llm-d's token processor (kvblock.ChunkedTokenDatabase: FNV-64a over CBOR,
//     chained from a seed and the model name);
//   - llm-d's indexer (kvcache.Indexer.ScoreTokens) turns a prompt's tokens into the same keys, looks them
//     up and scores each pod with llm-d's LongestPrefixScorer, weighing each block by the medium that
//     holds it (llm-d's default weights: gpu 1.0, cpu 0.8, any other medium 1.0).
//
// What is ours: the command line, the line protocol below, and countingAdapter, which wraps llm-d's
// adapter only to count what it parsed (so a test can tell that events arrive and that none failed).
//
// Usage:
//
//	llmd-harness --endpoint tcp://127.0.0.1:5557 [--endpoint ...] [--block-size 16] [--hash-seed ""]
//
// Protocol: one JSON object a line on stdin, one JSON answer a line on stdout (logs go to stderr):
//
//	{"op":"score","model":"M","tokens":[1,2,...]}  -> {"scores":{"POD":1.6,...}}   (llm-d's pod scores)
//	{"op":"stats"}                                 -> {"messages":..,"parse_errors":..,"events":{..},..}
//	{"op":"config"}                                -> {"block_size":16,"hash_seed":"","weights":{..}}
//
// A bad request is answered {"error":"..."}. It runs until stdin closes or it is killed (the test stops
// it by PID).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache/kvblock"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents/engineadapter"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// endpoints is a repeatable --endpoint flag.
type endpoints []string

func (e *endpoints) String() string     { return strings.Join(*e, ",") }
func (e *endpoints) Set(v string) error { *e = append(*e, v); return nil }

// countingAdapter is llm-d's vLLM adapter with counters around ParseMessage: every message the pool
// takes passes through here once, before llm-d applies its events to the index.
type countingAdapter struct {
	inner kvevents.EngineAdapter

	mu          sync.Mutex
	messages    int64            // messages parsed (or failed to parse)
	parseErrors int64            // messages llm-d could not parse (the whole batch is then dropped)
	lastError   string           // the last parse error, as llm-d words it
	events      map[string]int64 // events parsed, by type
	pods        map[string]int64 // messages by the pod named in the topic
	models      map[string]int64 // messages by the model named in the topic
	lastSeq     uint64           // the sequence number of the last message
}

func (c *countingAdapter) ShardingKey(msg *kvevents.RawMessage) string { return c.inner.ShardingKey(msg) }

func (c *countingAdapter) ParseMessage(msg *kvevents.RawMessage) (string, string, kvevents.EventBatch, error) {
	pod, model, batch, err := c.inner.ParseMessage(msg)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.messages++
	c.lastSeq = msg.Sequence
	if err != nil {
		c.parseErrors++
		c.lastError = err.Error()
		return pod, model, batch, err
	}
	c.pods[pod]++
	c.models[model]++
	for _, ev := range batch.Events {
		c.events[string(ev.Type())]++
	}
	return pod, model, batch, err
}

func (c *countingAdapter) stats() map[string]any {
	c.mu.Lock()
	defer c.mu.Unlock()
	return map[string]any{
		"messages": c.messages, "parse_errors": c.parseErrors, "last_error": c.lastError,
		"events": c.events, "pods": c.pods, "models": c.models, "last_seq": c.lastSeq,
	}
}

type request struct {
	Op     string   `json:"op"`
	Model  string   `json:"model"`
	Tokens []uint32 `json:"tokens"`
}

func main() {
	var eps endpoints
	flag.Var(&eps, "endpoint", "a kvpool master's --kv-events-endpoint to subscribe to (repeatable)")
	topicFilter := flag.String("topic-filter", "kv@", "ZMQ subscription prefix (llm-d's default)")
	blockSize := flag.Int("block-size", 16, "tokens per block of llm-d's token processor")
	hashSeed := flag.String("hash-seed", "", "llm-d's hash seed (its own keys; vLLM's PYTHONHASHSEED in a fleet)")
	flag.Parse()
	if len(eps) == 0 {
		fmt.Fprintln(os.Stderr, "llmd-harness: at least one --endpoint is needed")
		os.Exit(2)
	}
	log.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	ctx, cancel := context.WithCancel(log.IntoContext(context.Background(), log.Log))
	defer cancel()
	if err := run(ctx, eps, *topicFilter, *blockSize, *hashSeed); err != nil {
		fmt.Fprintln(os.Stderr, "llmd-harness:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, eps []string, topicFilter string, blockSize int, hashSeed string) error {
	// llm-d's token processor, the same one for the events and for the queries.
	tpConfig := kvblock.DefaultTokenProcessorConfig()
	tpConfig.BlockSizeTokens = blockSize
	tpConfig.HashSeed = hashSeed
	tokenProcessor, err := kvblock.NewChunkedTokenDatabase(tpConfig)
	if err != nil {
		return err
	}

	// llm-d's indexer with its default configuration: in-memory block index, longest-prefix scorer,
	// default medium weights; no tokenizer (queries come as tokens: Indexer.ScoreTokens).
	config, err := kvcache.NewDefaultConfig()
	if err != nil {
		return err
	}
	indexer, err := kvcache.NewKVCacheIndexer(ctx, config, tokenProcessor)
	if err != nil {
		return err
	}
	go indexer.Run(ctx)

	// llm-d's events pool on the indexer's block index, decoding with llm-d's vLLM adapter.
	adapter := &countingAdapter{inner: engineadapter.NewVLLMAdapter(), events: map[string]int64{},
		pods: map[string]int64{}, models: map[string]int64{}}
	pool := kvevents.NewPool(&kvevents.Config{TopicFilter: topicFilter, Concurrency: 4}, indexer.KVBlockIndex(),
		tokenProcessor, adapter)
	pool.Start(ctx)

	// llm-d's subscriber per master: connects (remote=true) to the master's PUB socket.
	subscribers := kvevents.NewSubscriberManager(pool)
	for i, ep := range eps {
		if err := subscribers.EnsureSubscriber(ctx, fmt.Sprintf("endpoint-%d", i), ep, topicFilter, true); err != nil {
			return fmt.Errorf("subscribing to %s: %w", ep, err)
		}
	}
	defer subscribers.Shutdown(ctx)

	weights := map[string]float64{}
	for _, b := range config.BackendConfigs {
		weights[b.Name] = b.Weight
	}

	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req request
		var answer any
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			answer = map[string]string{"error": "bad request: " + err.Error()}
		} else {
			switch req.Op {
			case "score":
				scores, err := indexer.ScoreTokens(ctx, req.Tokens, req.Model, nil, nil)
				if err != nil {
					answer = map[string]string{"error": err.Error()}
				} else {
					if scores == nil { // fewer tokens than one block: llm-d returns nil
						scores = map[string]float64{}
					}
					answer = map[string]any{"scores": scores}
				}
			case "stats":
				answer = adapter.stats()
			case "config":
				answer = map[string]any{"block_size": tokenProcessor.BlockSize(), "hash_seed": hashSeed,
					"weights": weights, "endpoints": eps, "topic_filter": topicFilter}
			default:
				answer = map[string]string{"error": fmt.Sprintf("unknown op %q", req.Op)}
			}
		}
		if err := out.Encode(answer); err != nil {
			return err
		}
	}
	return in.Err()
}
