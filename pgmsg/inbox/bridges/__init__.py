"""Bridges from brokers (RabbitMQ, NATS JetStream, Redis Streams, MQTT) into inboxes."""
