#!/bin/bash
# The whole test suite on a fresh machine: install what the tests need (Python packages and,
# when the Slurm test cluster harness is present, Debian packages), start the real Slurm test
# cluster, run every test, stop the cluster. Used by .ci/run and documented in README.md.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e '.[test]' || exit 1

cluster_started=0
pg_started=0
if [ -f tests/cluster/harness.py ] && [ "${HPCRUN_SKIP_CLUSTER:-0}" != 1 ]; then
  python3 tests/cluster/harness.py install || exit 1
  export HPCRUN_TEST_CLUSTER_DIR=${HPCRUN_TEST_CLUSTER_DIR:-/tmp/hpcrun-test-cluster}
  # the Charliecloud test image: restored from $HPCRUN_TEST_CACHE (default /var/cache/hpcrun-test)
  # in seconds, built in about a minute when its inputs changed; its tests skip if this fails
  image_start=$SECONDS
  python3 tests/cluster/image.py build \
    || echo "run-all: the Charliecloud test image could not be built; its tests will be skipped"
  echo "run-all: Charliecloud test image ready in $((SECONDS - image_start)) s"
  # several emulated nodes: multi-node jobs and the supervisor's fault campaign (issue 13)
  python3 tests/cluster/harness.py start --dir "$HPCRUN_TEST_CLUSTER_DIR" --nodes "${HPCRUN_TEST_NODES_COUNT:-3}" || exit 1
  cluster_started=1
  export HPCRUN_REQUIRE_CLUSTER=1
  # PostgreSQL for the shared-store tests, as the unprivileged test user on 127.0.0.1 (tests/pg.py):
  # every store and campaign test runs on SQLite and on it; here a PostgreSQL test may not skip
  HPCRUN_TEST_PG_DIR=${HPCRUN_TEST_PG_DIR:-/tmp/hpcrun-test-pg}
  python3 tests/pg.py stop "$HPCRUN_TEST_PG_DIR" 2>/dev/null
  rm -rf "$HPCRUN_TEST_PG_DIR"
  HPCRUN_TEST_PG_URL=$(python3 tests/pg.py start "$HPCRUN_TEST_PG_DIR") || { echo "run-all: PostgreSQL did not start"; exit 1; }
  export HPCRUN_TEST_PG_URL HPCRUN_TEST_PG_DIR HPCRUN_REQUIRE_POSTGRES=1
  pg_started=1
  echo "run-all: PostgreSQL on $HPCRUN_TEST_PG_URL"
fi

# two pytest-xdist workers: the cluster's tests run one after another on one of them (they share one
# cluster; tests/cluster/pytest_cluster.py groups them) while the tests that need none run on the other.
# HPCRUN_TEST_WORKERS=1 runs everything in one process. The 20 slowest tests close the output.
workers=${HPCRUN_TEST_WORKERS:-2}
parallel=()
if [ "$workers" -gt 1 ]; then
  parallel=(-n "$workers" --dist loadgroup)
fi
python3 -m pytest ${parallel[@]+"${parallel[@]}"} --durations=20 "$@"
rc=$?
[ "$rc" -eq 5 ] && { echo "pytest collected no tests"; rc=1; }

if [ "$pg_started" -eq 1 ]; then
  python3 tests/pg.py stop "$HPCRUN_TEST_PG_DIR" || true
fi
if [ "$cluster_started" -eq 1 ]; then
  python3 tests/cluster/harness.py stop --dir "$HPCRUN_TEST_CLUSTER_DIR" || rc=${rc:-1}
fi
exit "$rc"
