"""pko/devtools/pypiindex.py with the real pip on loopback, in a fresh venv: installs a test-made wheel
and the test-made wheel it requires from the index (pip checking each download against the index's hash),
pip's own "No matching distribution found" for a requirement the index lacks, the index's paths and
404s, and :func:`make_wheel`'s archive (names, METADATA, WHEEL, RECORD) read back."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pko.devtools.pypiindex import Index, make_wheel, normalize, serve_index, wheel_name

needs_venv_pip = pytest.mark.skipif(
    importlib.util.find_spec("ensurepip") is None, reason="this Python has no ensurepip: no pip in a venv"
)


@pytest.fixture
def venv_python(tmp_path: Path) -> Path:
    """A fresh venv's python, with the pip its ``ensurepip`` bundles: nothing installed yet."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
    return venv / "bin" / "python"


def pip_install(
    python: Path, index_url: str, requirements: list[str], check: bool = True
) -> subprocess.CompletedProcess[str]:
    """The real pip of ``python``'s venv, its only index ours: no config file, no PIP_* of the host
    (find-links, extra index), no cache, nothing else on the network."""
    env = {
        k: v for k, v in os.environ.items() if not k.lower().startswith(("pip_", "http_proxy", "https_proxy"))
    }
    env |= {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "PIP_RETRIES": "0",
    }
    args = [str(python), "-m", "pip", "install", "--index-url", index_url, "--no-cache-dir", *requirements]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    if check and done.returncode != 0:
        raise AssertionError(
            f"pip install {requirements}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        )
    return done


def run(python: Path, code: str) -> str:
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.strip()


def greeting_wheels(folder: Path) -> None:
    """Pko_E2E.Greeting 1.0.0 requiring pko-e2e-name>=2, and pko-e2e-name 1.0.0 and 2.0.0."""
    for version in ("1.0.0", "2.0.0"):
        make_wheel(folder, "pko-e2e-name", version, {"pko_e2e_name.py": f"NAME = 'pko {version}'\n"})
    make_wheel(
        folder,
        "Pko_E2E.Greeting",
        "1.0.0",
        {
            "pko_e2e_greeting/__init__.py": "from pko_e2e_name import NAME\n\n"
            "def greet():\n    return 'hello, ' + NAME\n"
        },
        requires=["pko-e2e-name>=2"],
    )


@pytest.fixture
def greeting(tmp_path: Path) -> Iterator[tuple[Index, str]]:
    """An index holding Pko_E2E.Greeting 1.0.0 and the pko-e2e-name it requires (both test-made)."""
    index = Index()
    greeting_wheels(tmp_path / "wheels")
    assert index.add_wheels(tmp_path / "wheels") == ["pko-e2e-greeting", "pko-e2e-name"]
    with serve_index(index) as url:
        yield index, url


@needs_venv_pip
def test_pip_installs_a_test_made_wheel_and_its_requirement(
    greeting: tuple[Index, str], venv_python: Path
) -> None:
    index, url = greeting
    assert url.endswith("/simple/")
    pip_install(venv_python, url, ["pko-e2e-greeting==1.0.0"])
    assert run(venv_python, "import pko_e2e_greeting; print(pko_e2e_greeting.greet())") == "hello, pko 2.0.0"
    versions = "from importlib.metadata import version as v; print(v('Pko_E2E.Greeting'), v('pko-e2e-name'))"
    assert run(venv_python, versions) == "1.0.0 2.0.0"
    assert ("GET", "/simple/pko-e2e-greeting/", 200) in index.requests
    assert ("GET", "/simple/pko-e2e-name/", 200) in index.requests
    assert ("GET", "/files/pko_e2e_name-2.0.0-py3-none-any.whl", 200) in index.requests
    assert ("GET", "/files/pko_e2e_name-1.0.0-py3-none-any.whl", 200) not in index.requests
    assert all(method == "GET" and status == 200 for method, _, status in index.requests), index.requests


@needs_venv_pip
def test_a_requirement_the_index_lacks_is_pips_own_no_matching_distribution(
    tmp_path: Path, venv_python: Path
) -> None:
    index = Index()
    greeting_wheels(tmp_path / "wheels")
    index.add_wheel(tmp_path / "wheels" / "pko_e2e_greeting-1.0.0-py3-none-any.whl")  # not its requirement
    with serve_index(index) as url:
        done = pip_install(venv_python, url, ["pko-e2e-greeting"], check=False)
        assert done.returncode != 0
        assert "No matching distribution found for pko-e2e-name>=2" in done.stderr, done.stderr
        assert ("GET", "/simple/pko-e2e-name/", 404) in index.requests

        done = pip_install(venv_python, url, ["pko-e2e-absent==1.0"], check=False)
        assert done.returncode != 0
        assert "No matching distribution found for pko-e2e-absent==1.0" in done.stderr, done.stderr
    assert ("GET", "/simple/pko-e2e-absent/", 404) in index.requests
    assert run(venv_python, "import importlib.util as u; print(u.find_spec('pko_e2e_name'))") == "None"


def test_index_paths_redirects_and_404s(tmp_path: Path) -> None:
    index = Index()
    greeting_wheels(tmp_path)
    index.add_wheels(tmp_path)
    env = {"wsgi.url_scheme": "http", "HTTP_HOST": "10.0.0.7:3141", "REQUEST_METHOD": "GET"}

    def get(path: str, method: str = "GET") -> tuple[str, dict[str, str], bytes]:
        answer: list[tuple[str, dict[str, str]]] = []
        body = b"".join(
            index(
                env | {"PATH_INFO": path, "REQUEST_METHOD": method}, lambda s, h: answer.append((s, dict(h)))
            )
        )
        return answer[0][0], answer[0][1], body

    status, headers, body = get("/simple/")
    assert status == "200 OK" and headers["Content-Type"].startswith("text/html")
    assert '<a href="pko-e2e-greeting/">pko-e2e-greeting</a>' in body.decode()
    assert '<a href="pko-e2e-name/">pko-e2e-name</a>' in body.decode()

    wheel = tmp_path / "pko_e2e_name-2.0.0-py3-none-any.whl"
    sha256 = hashlib.sha256(wheel.read_bytes()).hexdigest()
    status, _, body = get("/simple/pko-e2e-name/")
    assert status == "200 OK"
    assert f'<a href="../../files/{wheel.name}#sha256={sha256}">{wheel.name}</a>' in body.decode()
    assert body.decode().count("<a ") == 2

    for path, location in [
        ("/simple", "/simple/"),
        ("/simple/pko-e2e-name", "/simple/pko-e2e-name/"),
        ("/simple/Pko_E2E.Name/", "/simple/pko-e2e-name/"),
        ("/simple/absent", "/simple/absent/"),
    ]:
        status, headers, _ = get(path)
        assert (status, headers["Location"]) == ("301 Moved Permanently", location), path

    status, headers, body = get(f"/files/{wheel.name}")
    assert status == "200 OK" and body == wheel.read_bytes()
    assert headers["Content-Type"] == "application/octet-stream"
    assert headers["Content-Length"] == str(len(body))

    for path in ("/", "/simple/absent/", "/files/absent-1.0-py3-none-any.whl", "/files/", "/simple/a/b/",
                 "/simple/../files/x", "/pypi/pko-e2e-name/json"):  # fmt: skip
        assert get(path)[0] == "404 Not Found", path
    assert get("/simple/", "POST")[0] == "404 Not Found"
    assert index.requests[-1] == ("POST", "/simple/", 404)


def test_add_wheel_takes_wheel_names_once(tmp_path: Path) -> None:
    index = Index()
    first = make_wheel(tmp_path / "a", "pko-x", "1.0", {"pko_x.py": "X = 1\n"})
    assert index.add_wheel(first) == "pko-x"
    assert index.add_wheel(make_wheel(tmp_path / "b", "pko-x", "1.0", {"pko_x.py": "X = 1\n"})) == "pko-x"
    with pytest.raises(ValueError, match=r"pko_x-1\.0-py3-none-any\.whl: two files"):
        index.add_wheel(make_wheel(tmp_path / "c", "pko-x", "1.0", {"pko_x.py": "X = 2\n"}))
    (tmp_path / "pko-x-1.0.tar.gz").write_bytes(b"")
    with pytest.raises(ValueError, match="not a wheel"):
        index.add_wheel(tmp_path / "pko-x-1.0.tar.gz")
    assert list(index.projects) == ["pko-x"] and list(index.projects["pko-x"]) == [first.name]


def test_make_wheel_writes_a_valid_reproducible_wheel(tmp_path: Path) -> None:
    assert normalize("Foo__Bar.-baz") == "foo-bar-baz" and wheel_name("Foo-Bar.baz") == "foo_bar_baz"
    files = {"pko_y/__init__.py": "Y = 'y'\n", "pko_y/data,1.txt": "comma\n"}
    path = make_wheel(tmp_path, "Pko.Y", "0.1.0", files, requires=["pko-x>=1", "attrs; extra == 'a'"])
    assert path == tmp_path / "pko_y-0.1.0-py3-none-any.whl"
    info = "pko_y-0.1.0.dist-info"
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        contents = {name: archive.read(name) for name in names}
    assert names[-1] == f"{info}/RECORD"
    assert set(names) == {*files, f"{info}/METADATA", f"{info}/WHEEL", f"{info}/RECORD"}
    assert contents[f"{info}/METADATA"].decode().splitlines() == [
        "Metadata-Version: 2.1",
        "Name: Pko.Y",
        "Version: 0.1.0",
        "Requires-Dist: pko-x>=1",
        "Requires-Dist: attrs; extra == 'a'",
    ]
    wheel = contents[f"{info}/WHEEL"].decode().splitlines()
    assert {"Wheel-Version: 1.0", "Root-Is-Purelib: true", "Tag: py3-none-any"} <= set(wheel)
    assert any(line.startswith("Generator: ") for line in wheel)
    rows = list(csv.reader(io.StringIO(contents[f"{info}/RECORD"].decode())))
    assert rows[-1] == [f"{info}/RECORD", "", ""]
    assert sorted(row[0] for row in rows) == sorted(names)
    for name, hashed, size in rows[:-1]:
        digest = base64.urlsafe_b64encode(hashlib.sha256(contents[name]).digest()).rstrip(b"=").decode()
        assert (hashed, size) == (f"sha256={digest}", str(len(contents[name]))), name
    again = make_wheel(
        tmp_path / "again", "Pko.Y", "0.1.0", files, requires=["pko-x>=1", "attrs; extra == 'a'"]
    )
    assert again.read_bytes() == path.read_bytes()
    with pytest.raises(ValueError, match=r"'1\.0-1'"):
        make_wheel(tmp_path, "pko-z", "1.0-1", {})
