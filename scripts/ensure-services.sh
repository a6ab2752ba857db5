#!/usr/bin/env bash
# Start local PostgreSQL and Redis when they are installed but not running. Prints what it did;
# never fails: the tests themselves say clearly what they skipped when a service cannot be had.
set -u
if command -v pg_isready >/dev/null 2>&1 && ! pg_isready -h 127.0.0.1 -p 5432 -q; then
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    echo "ensure-services: starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
    for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
  fi
fi
if command -v pg_isready >/dev/null 2>&1 && pg_isready -h 127.0.0.1 -p 5432 -q; then
  echo "ensure-services: PostgreSQL up on 127.0.0.1:5432"
else
  echo "ensure-services: PostgreSQL NOT available: PostgreSQL tests will be skipped"
fi
if command -v redis-cli >/dev/null 2>&1 && ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  if command -v redis-server >/dev/null 2>&1; then
    echo "ensure-services: starting Redis"
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no || true
    for _ in $(seq 1 30); do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && break; sleep 0.5; done
  fi
fi
if command -v redis-cli >/dev/null 2>&1 && redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "ensure-services: Redis up on 127.0.0.1:6379"
else
  echo "ensure-services: Redis NOT available: Redis tests will be skipped"
fi
exit 0
