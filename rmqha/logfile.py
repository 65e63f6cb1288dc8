# -*- test-case-name: tests.test_logging -*-
"""
The broker's log file, rotated by size with Twisted's own
L{twisted.python.logfile.LogFile}: C{twistd rmqha --log-file PATH
[--log-rotate-size 10m] [--log-keep 10]} (docs/operations.md, "Logging");
SIGUSR1 rotates it at once, as twistd's own.  The admin port's access log
(C{--access-log FILE}, L{rmqha.admin.channel.AdminSite}) is the same kind
of file, rotated by SIGUSR1 with it.

twistd's own C{--logfile PATH} rotates at 1,000,000 bytes too, but keeps
every rotated file (C{PATH.1}, C{PATH.2}, ... without end) and cannot be
told otherwise; C{--log-file} bounds both.  twistd builds its log observer
before the service, from its own options only: the observer is handed to
it through twistd's C{--logger} option, which names a factory
(L{twistd_observer}), set by C{rmqha}'s options when they are parsed
(L{hand_to_twistd}).
"""

from __future__ import annotations

import os
import signal
from typing import Any, Callable

from twisted.logger import ILogObserver, textFileLogObserver
from twisted.python.logfile import LogFile

__all__ = [
    "DEFAULT_LOG_KEEP",
    "DEFAULT_LOG_ROTATE_SIZE",
    "LogFileSettings",
    "check_twistd_logging",
    "hand_to_twistd",
    "open_log_file",
    "rotate_on_usr1",
    "twistd_observer",
]

#: Bytes at which the log file is rotated (C{--log-rotate-size}).
DEFAULT_LOG_ROTATE_SIZE = 10 * 1024 * 1024
#: Rotated files kept (C{--log-keep}): the oldest is deleted beyond.
DEFAULT_LOG_KEEP = 10
#: The smallest C{--log-rotate-size} taken (a few lines).
MIN_LOG_ROTATE_SIZE = 1024

#: The name twistd's C{--logger} is given.
TWISTD_LOGGER = f"{__name__}.twistd_observer"

# The observer C{twistd --logger} asks for: set once, when twistd parses
# C{rmqha}'s options in this process, read by twistd right after.
_handed: list[tuple[ILogObserver, LogFile]] = []


class LogFileSettings:
    """
    Where the log goes and when it rotates.

    @ivar path: the log file (absolute).
    @ivar rotate_size: bytes at which it is rotated to C{PATH.1}.
    @ivar keep: rotated files kept (C{PATH.1} .. C{PATH.N}).
    """

    def __init__(self, path: str, rotate_size: int, keep: int) -> None:
        if rotate_size < MIN_LOG_ROTATE_SIZE:
            raise ValueError(
                f"--log-rotate-size {rotate_size} is below the minimum of "
                f"{MIN_LOG_ROTATE_SIZE} bytes"
            )
        if keep < 1:
            raise ValueError(f"--log-keep {keep} must be 1 or more")
        self.path = os.path.abspath(path)
        self.rotate_size = rotate_size
        self.keep = keep


def open_log_file(settings: LogFileSettings, flag: str = "--log-file") -> LogFile:
    """
    The log file, opened (created if missing) for appending, rotating at
    C{settings.rotate_size} bytes and keeping C{settings.keep} rotated
    files.

    @param flag: the option that named it, for errors.
    @raise ValueError: it cannot be opened, naming C{flag} and why.
    """
    directory, name = os.path.split(settings.path)
    try:
        return LogFile(
            name, directory, rotateLength=settings.rotate_size, maxRotatedFiles=settings.keep
        )
    except OSError as e:
        raise ValueError(f"{flag} {settings.path}: {e.strerror or e}") from None


def file_observer(log_file: LogFile) -> ILogObserver:
    """
    An observer writing events to C{log_file} as twistd's own does.
    """
    # (A LogFile is the file-like twistd gives it too, though not an IO.)
    observer: ILogObserver = textFileLogObserver(log_file)  # type: ignore[arg-type]
    return observer


def check_twistd_logging(parent: Any) -> None:
    """
    @param parent: twistd's options.
    @raise ValueError: twistd's own C{--logfile}, C{--logger} or
        C{--syslog} was given, which C{--log-file} contradicts.
    """
    for option in ("logfile", "logger", "syslog"):
        if parent.get(option):
            raise ValueError(
                f"--log-file and twistd's --{option} both say where to log: give one"
            )


def hand_to_twistd(parent: Any, log_file: LogFile) -> None:
    """
    Have twistd log to C{log_file}: name L{twistd_observer} as its
    C{--logger} (twistd resolves the name after the plugin's options are
    parsed).

    @param parent: twistd's options.
    @raise ValueError: L{check_twistd_logging}.
    """
    check_twistd_logging(parent)
    _handed[:] = [(file_observer(log_file), log_file)]
    parent["logger"] = TWISTD_LOGGER


#: What SIGUSR1 rotates, while L{_rotate_all} is its handler: each log file
#: with the function that runs its rotation outside the handler.
_rotated: list[tuple[LogFile, Callable[[Callable[[], None]], None]]] = []


def _rotate_all(signum: int, frame: Any) -> None:
    for log_file, call in list(_rotated):
        call(log_file.rotate)


def rotate_on_usr1(
    log_file: LogFile, call: Callable[[Callable[[], None]], None]
) -> Callable[[], None]:
    """
    Rotate C{log_file} at once on SIGUSR1, as twistd does its own
    C{--logfile} (unless the signal has another handler already): C{call}
    runs the rotation outside the signal handler (the reactor's
    C{callFromThread}).  Every file given is rotated by the one signal
    (the log file and the access log).

    @return: a function that stops rotating C{log_file} on the signal (the
        handler is removed with the last file).
    """
    handler = signal.getsignal(signal.SIGUSR1)
    if handler is not _rotate_all:
        if handler not in (None, signal.SIG_DFL):
            return lambda: None
        try:
            signal.signal(signal.SIGUSR1, _rotate_all)
        except ValueError:  # (not the main thread: no signals here)
            return lambda: None
        del _rotated[:]  # (left by a handler since replaced)
    entry = (log_file, call)
    _rotated.append(entry)

    def stop() -> None:
        if entry in _rotated:
            _rotated.remove(entry)
        if not _rotated and signal.getsignal(signal.SIGUSR1) is _rotate_all:
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)

    return stop


def twistd_observer() -> ILogObserver:
    """
    C{twistd --logger} factory: the observer of C{rmqha --log-file}, which
    SIGUSR1 rotates from now on.
    """
    if not _handed:
        raise RuntimeError(
            f"{TWISTD_LOGGER} is set by 'twistd rmqha --log-file PATH', not given by hand"
        )
    observer, log_file = _handed[0]

    def from_reactor(f: Callable[[], None]) -> None:
        from twisted.internet import reactor

        reactor.callFromThread(f)  # type: ignore[attr-defined]

    rotate_on_usr1(log_file, from_reactor)
    return observer
