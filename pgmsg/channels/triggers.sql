-- name: row_change
-- The body of a ChannelTrigger's function (pgmsg/channels/triggers.py): store each written row
-- as a notification of the channel, in the writing transaction. {channel} is the channel name,
-- validated to [a-z0-9_.-] (pgmsg/core/names.py), so it is safe as a literal. OLD is NULL on
-- INSERT and NEW on DELETE (PostgreSQL 11+). django-pgtrigger copies this text into the
-- migration of every model that declares the trigger: a change here (even of white space)
-- makes every such project's makemigrations write a new migration.
INSERT INTO pgmsg_notification (channel, payload) VALUES ('{channel}', jsonb_build_object('op', TG_OP, 'old', CASE WHEN TG_OP = 'INSERT' THEN NULL ELSE to_jsonb(OLD) END, 'new', CASE WHEN TG_OP = 'DELETE' THEN NULL ELSE to_jsonb(NEW) END));
RETURN NULL;
