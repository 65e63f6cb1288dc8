"""
Moved to L{rmqha.store._record}; this shim is removed after issue 13's merge.
"""

from rmqha.store._record import *  # noqa: F401,F403
from rmqha.store._record import (  # noqa: F401
    BLANK_MAGIC,
    DEFAULT_MAX_MESSAGE_SIZE,
    END_FILE_MIN_BLANK_LENGTH,
    MESSAGE_MAGIC_V1,
    MESSAGE_MAGIC_V2,
    MIN_RECORD_SIZE,
    Blank,
    Host,
    Message,
    MessageRejected,
    Record,
    RecordEncoder,
    RecordError,
    SysFlag,
    body_crc,
    decode_properties,
    encode_blank,
    encode_properties,
    encode_record,
    format_host,
    is_record_start,
    offset_msg_id,
    parse_record,
    record_body_length,
    record_length,
    record_starts,
    record_topic,
)
