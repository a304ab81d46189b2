"""Outside peers: an optional peer that cannot run is a documented gap, never a number."""

from __future__ import annotations

import sys

import pytest

from perf.bench import check_peers
from perf.harness import parse_methods
from perf.peers import PeerUnavailable, import_dflash


def test_dflash_that_is_not_importable_says_how_to_install_it(monkeypatch):
    monkeypatch.delenv("DFLASH_SRC", raising=False)
    monkeypatch.setitem(sys.modules, "dflash", None)
    monkeypatch.setitem(sys.modules, "dflash.model", None)
    with pytest.raises(PeerUnavailable, match="pip install --no-deps dflash==0.1.0"):
        import_dflash()


def test_a_peer_that_cannot_run_is_dropped_with_its_reason_and_the_rest_run():
    class Session:
        def peer(self, name, prompt, max_new_tokens):
            if name == "dflash":
                raise PeerUnavailable("no CUDA here")

    specs, gaps = check_peers(Session(), parse_methods("ar,chain,hf,dflash"), [1, 2, 3])
    assert [s.label for s in specs] == ["ar", "chain", "hf"] and gaps == {"dflash": "no CUDA here"}
