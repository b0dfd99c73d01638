-- name: declare_idle
-- Hold the idle key of each missing payload (shared, session-level: producers NOTIFY while
-- it is held), then try the barrier over the payloads to settle: true when no producer of
-- them is between its wake check and the end of its transaction (pgmsg_wake_idle(),
-- functions.sql).
SELECT declared, settled FROM pgmsg_wake_idle(%(missing)s::text[], %(settle)s::text[]);

-- name: withdraw
-- Busy again: release the idle keys of these payloads; producers stop NOTIFYing.
SELECT pgmsg_wake_busy(%(payloads)s::text[]);
