"""probe.py <url> <env file>: exit 0 when GET <url>/api/status/ with the env file's token answers 200.

Reads NETBOX_TOKEN from the env file so the token never appears on a command line. Exit 2 when NetBox answers
401/403 (the token is refused: waiting longer will not help), exit 1 on anything else (not up yet).
"""

import sys
import urllib.error
import urllib.request
from pathlib import Path


def main() -> int:
    url, env_file = sys.argv[1], Path(sys.argv[2])
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    request = urllib.request.Request(
        url.rstrip("/") + "/api/status/",
        headers={"Authorization": f"Bearer {env['NETBOX_TOKEN']}", "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return 0 if response.status == 200 else 1
    except urllib.error.HTTPError as error:
        return 2 if error.code in (401, 403) else 1
    except (urllib.error.URLError, OSError):
        return 1


if __name__ == "__main__":
    sys.exit(main())
