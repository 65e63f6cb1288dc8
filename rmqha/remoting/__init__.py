"""
RocketMQ's remoting protocol: the length-prefixed C{RemotingCommand} frames
that NameServers, brokers, admin tools and clients exchange, and the broker
metadata (topics, groups, offsets) they carry (docs/remoting.md).
"""
