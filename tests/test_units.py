"""
Tests for L{rmqha._units}.
"""

from twisted.trial.unittest import SynchronousTestCase

from rmqha._units import parse_size


class ParseSizeTests(SynchronousTestCase):
    """
    L{parse_size} reads operator-written sizes.
    """

    def test_suffixes(self) -> None:
        """
        Plain integers and binary suffixes, with optional B/iB, any case.
        """
        for text, value in [
            ("4096", 4096), ("64k", 65536), ("64K", 65536), ("1m", 1 << 20),
            ("1g", 1 << 30), ("1GiB", 1 << 30), ("2gb", 2 << 30), ("1t", 1 << 40),
            (" 7 ", 7), (0, 0), (123, 123),
        ]:
            self.assertEqual(parse_size(text), value, text)

    def test_errors_name_the_value(self) -> None:
        """
        Anything else is a ValueError naming the setting and the value.
        """
        for text in ["", "k", "1.5g", "-1", "12q", "1 g b"]:
            e = self.assertRaises(ValueError, parse_size, text, "--segment-size")
            self.assertIn("--segment-size", str(e))
        self.assertRaises(ValueError, parse_size, -5)
