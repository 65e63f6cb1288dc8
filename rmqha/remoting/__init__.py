"""
RocketMQ's remoting protocol: the length-prefixed C{RemotingCommand} frames
that NameServers, brokers, admin tools and clients exchange (docs/remoting.md).
"""
