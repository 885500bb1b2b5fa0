package browsertest_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/pgoutbox/pgoutbox/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(pgtest.Main(m)) }
