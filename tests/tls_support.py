"""A private certificate authority made with openssl, for the tests of TLS (Redis over TLS, webhook
receivers over HTTPS)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> tuple[str, str]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    openssl(
        "req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN=Wesichain test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return str(cert), str(key)


def issue(directory: Path, name: str, ca: tuple[str, str], extensions: str) -> tuple[str, str]:
    cert, key, csr = directory / f"{name}.pem", directory / f"{name}.key", directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    openssl(
        "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}",
    )  # fmt: skip
    openssl(
        "x509", "-req", "-in", str(csr), "-CA", ca[0], "-CAkey", ca[1],
        "-set_serial", "0x" + name.encode().hex(), "-days", "2", "-out", str(cert), "-extfile", str(ext),
    )  # fmt: skip
    return str(cert), str(key)
