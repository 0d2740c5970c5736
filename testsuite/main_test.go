package testsuite_test

import (
	"testing"

	"github.com/oncekit/oncekit/internal/pgtest"
	"github.com/oncekit/oncekit/testsuite"
)

func TestMain(m *testing.M) {
	testsuite.RunWorkerProcess(map[string]testsuite.WorkerMain{"crash": runCrashWorker})
	pgtest.Main(m)
}
