"""
rmqha's RocketMQ client over the remoting protocol, on Twisted: a
L{Producer} (SYNC sends and batches, NameServer routing, the Java
producer's retries), a L{PullConsumer} and a L{PushConsumer} (long
polling, rebalancing, offsets committed at least once), usable against rmqha brokers and genuine 4.9 ones.
See docs/client.md.
"""

from rmqha.client._codec import (
    Message,
    MessageQueue,
    SendError,
    SendReplyError,
    SendResult,
    SendStatus,
    UniqueIdFactory,
)
from rmqha.client._consume import (
    ConsumeFromWhere,
    PullReplyError,
    PullResult,
    PullStatus,
    ReceivedMessage,
)
from rmqha.client._routes import NameServerError, NoRouteError
from rmqha.client.consumer import (
    ConsumerError,
    ConsumeStatus,
    NoMasterError,
    PullConsumer,
    PushConsumer,
    QueueChange,
    QueueListener,
)
from rmqha.client.producer import (
    DEFAULT_RETRY_CODES,
    Producer,
    ProducerBusyError,
    QueueSelector,
    SendFailedError,
)

__all__ = [
    "ConsumeFromWhere",
    "ConsumeStatus",
    "ConsumerError",
    "PullConsumer",
    "PullReplyError",
    "PullResult",
    "PullStatus",
    "PushConsumer",
    "QueueChange",
    "QueueListener",
    "ReceivedMessage",
    "DEFAULT_RETRY_CODES",
    "Message",
    "MessageQueue",
    "NameServerError",
    "NoMasterError",
    "NoRouteError",
    "Producer",
    "ProducerBusyError",
    "QueueSelector",
    "SendError",
    "SendFailedError",
    "SendReplyError",
    "SendResult",
    "SendStatus",
    "UniqueIdFactory",
]
