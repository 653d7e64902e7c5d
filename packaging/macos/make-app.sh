#!/bin/sh
# Build ~/Applications/Sluice.app, a tiny bundle whose executable runs the installed `sluice` command
# (what `sluice install-launcher` does on macOS). Usage: sh packaging/macos/make-app.sh [path/to/sluice]
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${1:-$ROOT/.venv/bin/sluice}
[ -x "$TARGET" ] || { echo "Sluice is not installed at $TARGET; run packaging/install.sh first." >&2; exit 1; }
APP="$HOME/Applications/Sluice.app"
mkdir -p "$APP/Contents/MacOS" "$APP/Contents/Resources"
cp "$ROOT/packaging/macos/Info.plist" "$APP/Contents/Info.plist"
cp "$ROOT/resources/io.github.sluice.Sluice.svg" "$APP/Contents/Resources/"
printf '#!/bin/sh\nexec "%s" "$@"\n' "$TARGET" > "$APP/Contents/MacOS/Sluice"
chmod 755 "$APP/Contents/MacOS/Sluice"
echo "installed $APP"
