"""
The store: a commit log laid out on disk exactly like Apache RocketMQ 4.9's,
and the services around it.

  - L{rmqha.store._record}: the record codec (the only one), the header hop
    and the incremental validator every reader of raw bytes uses;
  - L{rmqha.store._segments}: RocketMQ's C{MappedFileQueue}: segment files,
    allocation, the lock, flush plans, zeroing, quarantine;
  - L{rmqha.store._recovery}: what open does to a store's tail, C{verify},
    C{repair}, their reports;
  - L{rmqha.store._queues}: the queue-offset table and its snapshot;
  - L{rmqha.store.errors}: every error the store raises;
  - L{rmqha.store.commitlog}: L{CommitLog} itself: put, append_at, read,
    truncate, records; what is not on its hot paths is in
    L{rmqha.store._damage} (the damage watch), L{rmqha.store._flush} (flush
    planning), L{rmqha.store._batch} (batch encoding),
    L{rmqha.store._records} (decoding records), L{rmqha.store._replica}
    (the replica tail and the cut back) and L{rmqha.store._rolling}
    (rolling to a new segment);
  - L{rmqha.store.service}: the commit log as a Twisted service (flush);
  - L{rmqha.store.scrub}: the background scrub.

Import from the modules (C{from rmqha.store.commitlog import CommitLog,
Message}): this package imports nothing itself, so the data pipeline's
executors, which need only the codec, do not load the rest.
"""
