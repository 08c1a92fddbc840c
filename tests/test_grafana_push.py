"""`headroom dashboards push` through the real grafana-client against a loopback Grafana API double.

Grafana itself cannot run here. The double answers the calls the push makes and checks each one
against the shape of Grafana's HTTP API (docs: /api/folders, /api/dashboards/db): bearer auth,
JSON bodies with the documented fields. A request of the wrong shape gets Grafana's 400/401/404
and is recorded as a violation.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from collector.cli import main
from collector.dashboards.push import PushError, push_dashboards

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "glsa_test_token"


class FakeGrafana:
    """Loopback server with Grafana's folder and dashboard endpoints; records requests and violations."""

    def __init__(self, folders: list[dict] | None = None) -> None:
        self.folders = list(folders or [])
        self.dashboards: dict[str, dict] = {}
        self.requests: list[tuple[str, str, dict | None]] = []
        self.violations: list[str] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeGrafana:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, method: str, path: str, headers, body: dict | None) -> tuple[int, object]:
        self.requests.append((method, path, body))
        if headers.get("Authorization") != f"Bearer {TOKEN}":
            return 401, {"message": "Unauthorized"}
        if (method, path) == ("GET", "/api/folders"):
            return 200, self.folders
        if (method, path) == ("POST", "/api/folders"):
            return self._create_folder(body)
        if (method, path) == ("POST", "/api/dashboards/db"):
            return self._save_dashboard(body)
        return self._violation(404, f"{method} {path} is not a call the push should make")

    def _violation(self, status: int, message: str) -> tuple[int, dict]:
        self.violations.append(message)
        return status, {"message": message}

    def _create_folder(self, body: dict | None) -> tuple[int, object]:
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("title"), str)
            or set(body) - {"title", "uid", "parentUid"}
        ):
            return self._violation(400, f"folder body {body!r} is not {{title, uid?, parentUid?}}")
        folder = {
            "id": len(self.folders) + 1,
            "uid": body.get("uid") or f"gen{len(self.folders)}",
            "title": body["title"],
        }
        self.folders.append(folder)
        return 200, folder

    def _save_dashboard(self, body: dict | None) -> tuple[int, object]:
        if not isinstance(body, dict) or not isinstance(body.get("dashboard"), dict):
            return self._violation(400, "body must be {dashboard: {...}, folderUid, overwrite}")
        board, folder_uid = body["dashboard"], body.get("folderUid")
        if folder_uid not in {f["uid"] for f in self.folders}:
            return self._violation(400, f"folderUid {folder_uid!r} does not exist")
        if not isinstance(body.get("overwrite"), bool) or board.get("id") is not None or not board.get("uid"):
            return self._violation(400, "overwrite must be a bool; dashboard needs a uid and no id")
        if not board.get("title") or not isinstance(board.get("panels"), list):
            return self._violation(400, "dashboard needs title and panels")
        if board["uid"] in self.dashboards and not body["overwrite"]:
            return 412, {"message": "A dashboard with the same uid already exists", "status": "name-exists"}
        version = self.dashboards.get(board["uid"], {}).get("version", 0) + 1
        self.dashboards[board["uid"]] = {"dashboard": board, "folderUid": folder_uid, "version": version}
        return 200, {
            "id": len(self.dashboards),
            "uid": board["uid"],
            "status": "success",
            "version": version,
            "url": f"/d/{board['uid']}/x",
            "slug": "x",
        }

    def _handler(self):
        grafana = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = None
                if raw:
                    if not self.headers.get("Content-Type", "").startswith("application/json"):
                        grafana.violations.append(f"{method} {self.path} body is not application/json")
                    body = json.loads(raw)
                status, payload = grafana.answer(method, self.path.split("?")[0], self.headers, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def log_message(self, *args):
                pass

        return Handler


def _boards() -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((ROOT / "dashboards").glob("*.json"))]


def test_push_creates_folder_then_uploads_every_dashboard_with_datasource_uid():
    with FakeGrafana() as grafana:
        answers = push_dashboards(grafana.url, TOKEN, _boards(), datasource_uid="prom-main")
    assert grafana.violations == []
    calls = [(m, p) for m, p, _ in grafana.requests]
    assert calls[:2] == [("GET", "/api/folders"), ("POST", "/api/folders")]
    assert calls[2:] == [("POST", "/api/dashboards/db")] * 3
    assert {a["status"] for a in answers} == {"success"}
    assert set(grafana.dashboards) == {
        "headroom-capacity-overview",
        "headroom-tenants",
        "headroom-capacity-review",
    }
    for saved in grafana.dashboards.values():
        assert saved["folderUid"] == "llm-headroom"
        variable = next(v for v in saved["dashboard"]["templating"]["list"] if v["type"] == "datasource")
        assert variable["current"]["value"] == "prom-main"


def test_push_reuses_an_existing_folder_and_overwrites():
    with FakeGrafana(folders=[{"id": 4, "uid": "cap", "title": "capacity"}]) as grafana:
        push_dashboards(grafana.url, TOKEN, _boards(), folder="capacity")
        push_dashboards(grafana.url, TOKEN, _boards(), folder="capacity")
        with pytest.raises(PushError, match="refused POST /api/dashboards/db"):
            push_dashboards(grafana.url, TOKEN, _boards(), folder="capacity", overwrite=False)
    assert grafana.violations == []
    assert ("POST", "/api/folders") not in [(m, p) for m, p, _ in grafana.requests]
    assert {d["version"] for d in grafana.dashboards.values()} == {2}
    assert {d["folderUid"] for d in grafana.dashboards.values()} == {"cap"}


def test_cli_push_uploads_and_a_bad_token_is_a_readable_error():
    runner = CliRunner()
    with FakeGrafana() as grafana:
        ok = runner.invoke(
            main,
            [
                "dashboards",
                "push",
                "--grafana-url",
                grafana.url,
                "--token",
                TOKEN,
                "--dir",
                str(ROOT / "dashboards"),
            ],
        )
        bad = runner.invoke(
            main,
            [
                "dashboards",
                "push",
                "--grafana-url",
                grafana.url,
                "--token",
                "wrong",
                "--dir",
                str(ROOT / "dashboards"),
            ],
        )
    assert ok.exit_code == 0, ok.output
    assert ok.output.count("pushed llm-headroom /") == 3
    assert bad.exit_code != 0 and "refused GET /api/folders" in bad.output and "token" in bad.output
    assert grafana.violations == []


def test_cli_push_names_an_empty_directory(tmp_path):
    result = CliRunner().invoke(
        main,
        [
            "dashboards",
            "push",
            "--grafana-url",
            "http://127.0.0.1:9",
            "--token",
            TOKEN,
            "--dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code != 0 and "headroom dashboards generate" in result.output
