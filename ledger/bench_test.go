package ledger_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/oncekit/oncekit/ledger"
)

// The ledger's hot paths beside the bare transaction they guard, for go test -bench.
// make bench measures the same paths on fresh clusters, interleaved, as ratios; these
// are for profiling one path (-cpuprofile) and for quick comparisons while editing.
//
//	go test ./ledger -run '^$' -bench . -benchtime 2000x

func BenchmarkBareTx(b *testing.B) {
	_, bb := setup(b, nil)
	ctx := context.Background()
	for b.Loop() {
		err := pgx.BeginFunc(ctx, bb.pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO orders (tenant, item, amount) VALUES ('acme', 'bench', 1)`)
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}

func benchmarkDo(b *testing.B, opts *ledger.DoOpts, replay bool) {
	l, _ := setup(b, nil)
	ctx := context.Background()
	req := order{Item: "bench", Amount: 1}
	fn := createOrder("acme", req)
	if replay {
		if _, err := l.Do(ctx, intent(b, "acme", "bench-replay", req), fn, opts); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	for b.Loop() {
		key := "bench-replay"
		if !replay {
			i++
			key = "bench-" + strconv.Itoa(i)
		}
		res, err := l.Do(ctx, intent(b, "acme", key, req), fn, opts)
		if err != nil || res.Replayed != replay {
			b.Fatal(err, res.Replayed)
		}
	}
}

func BenchmarkDo_First(b *testing.B) { benchmarkDo(b, nil, false) }
func BenchmarkDo_FirstClaimFirst(b *testing.B) {
	benchmarkDo(b, &ledger.DoOpts{Mode: ledger.ModeClaimFirst}, false)
}
func BenchmarkDo_FirstOptimistic(b *testing.B) {
	benchmarkDo(b, &ledger.DoOpts{Mode: ledger.ModeOptimistic}, false)
}
func BenchmarkDo_Replay(b *testing.B) { benchmarkDo(b, nil, true) }
func BenchmarkDo_ReplayClaimFirst(b *testing.B) {
	benchmarkDo(b, &ledger.DoOpts{Mode: ledger.ModeClaimFirst}, true)
}
