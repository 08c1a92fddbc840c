"""Upload the generated dashboards to a Grafana with grafana-client: folder, datasource uid, overwrite.

The folder is looked up by title (GET /api/folders) and created when missing (POST /api/folders);
each dashboard is posted to /api/dashboards/db with that folder's uid. The `$datasource`
variable's default is pointed at the given datasource uid, so panels work on first open.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grafana_client import GrafanaApi

__all__ = ["PushError", "with_datasource", "load_dashboards", "push_dashboards"]

FOLDER_UID = "llm-headroom"
Dashboard = dict[str, Any]  # a Grafana dashboard as JSON (also what Grafana answers to a push)


class PushError(RuntimeError):
    """Grafana refused or could not be reached; the message says which call and what to check."""


def with_datasource(dashboard: Dashboard, datasource_uid: str) -> Dashboard:
    """A copy of `dashboard` whose `$datasource` variable defaults to `datasource_uid`; no numeric id."""
    board: Dashboard = json.loads(json.dumps(dashboard))
    board.pop("id", None)
    for variable in board.get("templating", {}).get("list", []):
        if variable.get("type") == "datasource":
            variable["current"] = {"text": datasource_uid, "value": datasource_uid}
    return board


def load_dashboards(directory: Path) -> list[Dashboard]:
    """Every *.json in `directory`, sorted by name; raises PushError naming an empty or bad directory."""
    paths = sorted(directory.glob("*.json"))
    if not paths:
        raise PushError(f"no dashboards (*.json) in {directory}; run `headroom dashboards generate` first")
    boards: list[Dashboard] = []
    for path in paths:
        try:
            boards.append(json.loads(path.read_text(encoding="utf-8")))
        except json.JSONDecodeError as exc:
            raise PushError(
                f"{path} is not valid JSON ({exc}); regenerate it with `headroom dashboards generate`"
            ) from exc
    return boards


def _folder_uid(api: GrafanaApi, title: str) -> str:
    """The uid of the folder called `title`, created when no folder has that title."""
    # grafana-client ships py.typed but leaves its Folder methods unannotated
    for folder in api.folder.get_all_folders() or []:  # type: ignore[no-untyped-call]
        if folder.get("title") == title:
            return str(folder["uid"])
    created = api.folder.create_folder(  # type: ignore[no-untyped-call]
        title, uid=FOLDER_UID if title == "llm-headroom" else None
    )
    return str(created["uid"])


def push_dashboards(
    grafana_url: str,
    token: str,
    dashboards: Iterable[Dashboard],
    *,
    folder: str = "llm-headroom",
    datasource_uid: str = "headroom-prometheus",
    overwrite: bool = True,
    progress: Callable[[str], None] = lambda title: None,
) -> list[Dashboard]:
    """Upload `dashboards` into `folder`; returns Grafana's answer per dashboard (uid, url, version)."""
    # lazy: grafana-client (and its HTTP stack) loads only for `headroom dashboards push`
    from grafana_client import GrafanaApi
    from grafana_client.client import GrafanaException

    api = GrafanaApi.from_url(grafana_url, credential=token)
    call = "GET /api/folders"
    try:
        folder_uid = _folder_uid(api, folder)
        answers: list[Dashboard] = []
        for board in dashboards:
            call = f"POST /api/dashboards/db ({board.get('uid')})"
            answers.append(
                api.dashboard.update_dashboard(
                    {
                        "dashboard": with_datasource(board, datasource_uid),
                        "folderUid": folder_uid,
                        "overwrite": overwrite,
                        "message": "headroom dashboards push",
                    }
                )
            )
            progress(str(board.get("title", board.get("uid", "?"))))
        return answers
    except GrafanaException as exc:
        raise PushError(
            f"Grafana at {grafana_url} refused {call}: {exc.message}. Check the URL, that the token "
            f"has Editor rights, and --no-overwrite conflicts"
        ) from exc
    except Exception as exc:  # connection errors come from niquests/urllib3 with varied types
        raise PushError(f"could not reach Grafana at {grafana_url} during {call}: {exc}") from exc
