# Create Start-menu and desktop shortcuts for Sluice (what `sluice install-launcher` runs on Windows).
# Usage (from the repository, with Sluice installed in .venv):
#   powershell -ExecutionPolicy Bypass -File packaging\windows\install-shortcut.ps1
# or with an explicit target:
#   ... -Target C:\path\to\.venv\Scripts\pythonw.exe -Arguments "-m app.main"
# pythonw starts the GUI without a console window.
param(
    [string]$Target = "",
    [string]$Arguments = "",
    [string]$Icon = ""
)
$root = Resolve-Path (Join-Path $PSScriptRoot "..\..")
if (-not $Target) { $Target = Join-Path $root ".venv\Scripts\pythonw.exe"; $Arguments = "-m app.main" }
if (-not (Test-Path $Target)) { Write-Error "Sluice is not installed at $Target; run the installer first."; exit 1 }
if (-not $Icon) { $Icon = Join-Path $root "resources\io.github.sluice.Sluice.ico" }
$shell = New-Object -ComObject WScript.Shell
$places = @([Environment]::GetFolderPath("Programs"), [Environment]::GetFolderPath("Desktop"))
foreach ($dir in $places) {
    $link = $shell.CreateShortcut((Join-Path $dir "Sluice.lnk"))
    $link.TargetPath = $Target
    $link.Arguments = $Arguments.Trim()
    $link.WorkingDirectory = [Environment]::GetFolderPath("UserProfile")
    $link.IconLocation = $Icon
    $link.Description = "Chat with Mixture-of-Experts language models larger than your GPU"
    $link.Save()
    Write-Output "installed $(Join-Path $dir 'Sluice.lnk')"
}
