# -*- test-case-name: tests.test_remoting_frames -*-
"""
The numbers of RocketMQ's remoting protocol, as 4.9.8 defines them:
request codes (C{RequestCode}), response codes (C{ResponseCode} and the
C{RemotingSysResponseCode} it extends), the language a sender names
(C{LanguageCode}), the header encodings (C{SerializeType}) and the version
every rmqha command carries.

Request and response codes share one number space per direction only: a
command's C{code} is a request code in a request and a response code in a
response (flag bit 0), so the two are separate enums.
"""

from __future__ import annotations

import enum

__all__ = [
    "RequestCode",
    "ResponseCode",
    "LanguageCode",
    "SerializeType",
    "VERSION_4_9_8",
]

#: C{MQVersion.Version.V4_9_8.ordinal()}: what a genuine 4.9.8 broker,
#: NameServer and client send as C{version}, and what rmqha sends (below 37
#: a NameServer reads REGISTER_BROKER the legacy way and registers no topic).
VERSION_4_9_8 = 409


class RequestCode(enum.IntEnum):
    """
    The requests rmqha knows by name (C{common/protocol/RequestCode.java}).
    A request with another code is still decoded; it is answered
    REQUEST_CODE_NOT_SUPPORTED unless a handler takes it.
    """

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    CHECK_CLIENT_CONFIG = 46
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_KVLIST_BY_NAMESPACE = 219
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    QUERY_DATA_VERSION = 322


class ResponseCode(enum.IntEnum):
    """
    Response codes: 0-4 from C{RemotingSysResponseCode}, the rest from
    C{common/protocol/ResponseCode.java}.
    """

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    FLUSH_DISK_FAILED = 29
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_BUYER_ID = 204
    NOT_IN_CURRENT_UNIT = 205
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    UPDATE_AND_CREATE_ACL_CONFIG_FAILED = 209
    DELETE_ACL_CONFIG_FAILED = 210
    UPDATE_GLOBAL_WHITE_ADDRS_CONFIG_FAILED = 211
    FLOW_CONTROL = 215


class LanguageCode(enum.IntEnum):
    """
    The sender's language: its byte in the binary header, its name in
    the JSON one (C{remoting/protocol/LanguageCode.java}).
    """

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12


class SerializeType(enum.IntEnum):
    """
    How a frame's header is encoded: the top byte of its second int.
    """

    JSON = 0
    ROCKETMQ = 1
