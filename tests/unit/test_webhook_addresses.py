"""Which webhook URLs are refused: malformed ones, and hosts that reach a non-public address.

Resolution is faked (``socket.getaddrinfo``) for host names; IP literals resolve without a lookup.
Nothing here opens a connection.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from shared.errors import InvalidRequest
from shared.webhooks import check_url, is_public_address, resolve_checked, webhook_endpoint

PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "93.184.215.14",
    "192.0.1.1",  # just below the IETF block
    "192.0.3.1",
    "100.63.255.255",  # just below the shared space
    "100.128.0.1",
    "198.20.0.1",  # just above benchmarking
    "223.255.255.254",
    "2606:4700::1111",
    "2a00:1450:4001:80b::200e",
    "64:ff9b::808:808",  # NAT64 of 8.8.8.8
    "2002:808:808::1",  # 6to4 of 8.8.8.8
    "::ffff:8.8.8.8",  # IPv4-mapped 8.8.8.8
]

NOT_PUBLIC = [
    # IPv4
    "0.0.0.0",
    "0.1.2.3",
    "10.1.2.3",
    "100.64.0.1",  # shared address space
    "100.127.255.254",
    "127.0.0.1",
    "127.255.255.254",
    "169.254.169.254",  # cloud metadata
    "172.16.0.1",
    "172.31.255.254",
    "192.0.0.8",  # IETF protocol assignments: all of 192.0.0.0/24
    "192.0.0.9",
    "192.0.0.170",
    "192.0.0.255",
    "192.0.2.1",  # documentation
    "192.88.99.1",  # 6to4 relay anycast
    "192.168.1.1",
    "198.18.0.1",  # benchmarking
    "198.19.255.254",
    "198.51.100.7",
    "203.0.113.9",
    "224.0.0.1",  # multicast
    "239.255.255.250",
    "240.0.0.1",  # reserved
    "255.255.255.255",  # broadcast
    # IPv6
    "::",
    "::1",
    "::127.0.0.1",  # IPv4-compatible
    "::a9fe:a9fe",
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:169.254.169.254",
    "::ffff:10.0.0.1",
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b::7f00:1",
    "64:ff9b::a00:1",
    "64:ff9b:1::808:808",  # local-use NAT64: refused whatever it embeds
    "64:ff9b:1::a9fe:a9fe",
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::",
    "2002:c0a8:101::1",
    "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
    "2001:0:808:808::f7f7:f7f7",  # Teredo naming public addresses: still refused
    "2001:2::1",  # benchmarking
    "2001:db8::1",  # documentation
    "3fff::1",
    "100::1",  # discard-only
    "fc00::1",  # unique-local
    "fd12:3456::1",
    "fe80::1",  # link-local
    "fe80::1%eth0",
    "fec0::1",  # site-local
    "ff02::1",  # multicast
    "ff0e::1",
    "4000::1",  # unallocated
]


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_pass(address: str) -> None:
    assert is_public_address(ipaddress.ip_address(address)) is True


@pytest.mark.parametrize("address", NOT_PUBLIC)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert is_public_address(ipaddress.ip_address(address)) is False


BAD_URLS = [
    "http://hooks.example.test:99999/x",
    "http://hooks.example.test:-1/x",
    "http://hooks.example.test:abc/x",
    "http://hooks.example.test:0/x",
    "http://hooks.example.test:80:80/x",
    "http://hooks exam.example.test/x",
    "http:///x",
    "http://:8080/x",
    "http://user:secret@hooks.example.test/x",
    "http://user@hooks.example.test/x",
    "http://[::1/x",
    "http://[fe80::1%25eth0]/x",
    "http://hooks..example.test/x",
    "http://-hooks.example.test/x",
    "ftp://hooks.example.test/x",
    "hooks.example.test/x",
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_malformed_urls_are_invalid_requests(url: str) -> None:
    with pytest.raises(InvalidRequest, match="webhook url"):
        webhook_endpoint(url)
    with pytest.raises(InvalidRequest, match="webhook url"):
        check_url(url, allow_private=True)


def test_an_endpoint_is_its_host_and_port() -> None:
    assert webhook_endpoint("https://Hooks.Example.test/x") == ("hooks.example.test", 443)
    assert webhook_endpoint("http://hooks.example.test/x") == ("hooks.example.test", 80)
    assert webhook_endpoint("http://hooks.example.test:/x") == ("hooks.example.test", 80)
    assert webhook_endpoint("https://hooks.example.test:8443/x") == ("hooks.example.test", 8443)
    assert webhook_endpoint("https://bücher.example/x") == ("xn--bcher-kva.example", 443)
    assert webhook_endpoint("http://[::FFFF:7f00:1]:81/") == ("::ffff:7f00:1", 81)


@pytest.mark.parametrize("address", [a for a in NOT_PUBLIC if "%" not in a])
def test_urls_naming_a_non_public_address_are_refused(address: str) -> None:
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(InvalidRequest, match="which is not a public address"):
        check_url(f"https://{host}:8443/hook")
    check_url(f"https://{host}:8443/hook", allow_private=True)  # a deployment may allow them


@pytest.mark.parametrize("address", PUBLIC)
def test_urls_naming_a_public_address_pass(address: str) -> None:
    host = f"[{address}]" if ":" in address else address
    check_url(f"https://{host}/hook")


class FakeDns:
    """``socket.getaddrinfo`` answering ``answers`` for host names, and nothing else."""

    def __init__(self, answers: dict[str, list[str]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def __call__(self, host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        self.asked.append(host)
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [
            (
                socket.AF_INET6 if ":" in ip else socket.AF_INET,
                socket.SOCK_STREAM,
                socket.IPPROTO_TCP,
                "",
                (ip, port, 0, 0) if ":" in ip else (ip, port),
            )
            for ip in self.answers[host]
        ]


def test_a_name_is_refused_if_any_of_its_addresses_is_not_public(monkeypatch: pytest.MonkeyPatch) -> None:
    dns = FakeDns(
        {
            "public.example.test": ["93.184.215.14", "2606:4700::1111", "93.184.215.14"],
            "mixed.example.test": ["93.184.215.14", "64:ff9b::a9fe:a9fe"],
            "private.example.test": ["10.0.0.7"],
        }
    )
    monkeypatch.setattr(socket, "getaddrinfo", dns)
    assert resolve_checked("public.example.test", 443) == [
        ipaddress.ip_address("93.184.215.14"),
        ipaddress.ip_address("2606:4700::1111"),
    ]
    with pytest.raises(InvalidRequest, match="reaches 64:ff9b::a9fe:a9fe, which is not a public address"):
        check_url("https://mixed.example.test/hook")
    with pytest.raises(InvalidRequest, match="reaches 10.0.0.7, which is not a public address"):
        check_url("https://private.example.test/hook")
    assert resolve_checked("private.example.test", 80, allow_private=True) == [
        ipaddress.ip_address("10.0.0.7")
    ]
    with pytest.raises(InvalidRequest, match="does not resolve"):
        check_url("https://unknown.example.test/hook")
    check_url("https://public.example.test/hook")
    # One lookup per check, of the name as given.
    assert dns.asked == [
        "public.example.test",
        "mixed.example.test",
        "private.example.test",
        "private.example.test",
        "unknown.example.test",
        "public.example.test",
    ]
