from twisted.application.service import ServiceMaker

rmqha = ServiceMaker(
    "rmqha",
    "rmqha.tap",
    "RocketMQ-compatible commit log with master/slave replication",
    "rmqha",
)
