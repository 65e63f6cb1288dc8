"""
rmqha: Apache RocketMQ's master/slave commit-log replication on Twisted,
wire- and disk-compatible with RocketMQ 4.9.x.
"""

__version__ = "0.1.0"
