package testsuite_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/testsuite"
)

func TestMain(m *testing.M) {
	testsuite.RunWorkerProcess(map[string]testsuite.WorkerMain{
		"crash": runCrashWorker,
		"idle": func(ctx context.Context) error {
			testsuite.Mark("ready")
			<-ctx.Done()
			return nil
		},
		"fail": func(context.Context) error { return errors.New("cannot reach the database") },
	})
	pgtest.Main(m)
}

// A worker process can be waited for, stopped with SIGTERM, or killed; each way reports
// how it ended.
func TestWorkerProcess_WaitStopKill(t *testing.T) {
	t.Parallel()
	failed := testsuite.StartWorkerProcess(t, "fail", nil)
	code, err := failed.Wait(time.Minute)
	if err != nil || code != 1 {
		t.Fatalf("a worker that fails exits 1: got %d, %v", code, err)
	}

	idle := testsuite.StartWorkerProcess(t, "idle", nil)
	idle.WaitFor(t, "ready", time.Minute)
	if _, err := idle.Wait(100 * time.Millisecond); err == nil {
		t.Fatal("Wait returned while the worker was still running")
	}
	code, err = idle.Stop(time.Minute)
	if err != nil || code != 0 {
		t.Fatalf("a stopped worker exits 0: got %d, %v", code, err)
	}
	if idle.Killed() || idle.Kill() {
		t.Fatal("a stopped worker was not killed, and is gone")
	}

	killed := testsuite.StartWorkerProcess(t, "idle", nil)
	killed.WaitFor(t, "ready", time.Minute)
	if !killed.Kill() || !killed.Killed() {
		t.Fatal("Kill ends a running worker with SIGKILL")
	}
	code, err = killed.Wait(time.Second)
	if err != nil || code != -1 {
		t.Fatalf("a killed worker reports exit code -1: got %d, %v", code, err)
	}
}
