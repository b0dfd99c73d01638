-- name: configure_session
-- A worker session's bounds (WORKER_IDLE_TIMEOUT): PostgreSQL ends a session whose
-- transaction sits idle longer than %(idle)s ms (a frozen worker's batch goes back), and
-- its keepalive probes and tcp_user_timeout give up on a silent client in about that time.
SELECT set_config('idle_in_transaction_session_timeout', %(idle)s, false),
       set_config('tcp_keepalives_idle', %(keepalive_idle)s, false),
       set_config('tcp_keepalives_interval', %(keepalive_interval)s, false),
       set_config('tcp_keepalives_count', '3', false),
       set_config('tcp_user_timeout', %(idle)s, false);
