"""RocketMQ's remoting protocol and the broker metadata it serves."""
