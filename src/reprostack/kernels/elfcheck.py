"""Post-build check of an extension's ELF: a statically linked libstdc++ must stay private.

Why: a `.so` that carries its own libstdc++ (no `libstdc++.so.6` in NEEDED) and exports its std::
symbols mixes them with the process's shared libstdc++ (torch's): `std::locale::id` indices then
disagree and `use_facet` hands out the wrong facet. Seen on the lent H200 (2026-11-29): SIGSEGV in
std::regex inside DeepEP's first dispatch; reproduced on the CPU as std::bad_cast (tests/test_kernels.py).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from ..errors import BuildError

LOCALE_ID = "_ZNKSt6locale2id5_M_idEv"  # std::locale::id::_M_id() const


def libstdcxx_exposure(so: Path) -> dict | None:
    """{"needs_libstdcxx": bool, "exported_std_symbols": int, "exports_locale_id": bool} from `readelf`;
    None when readelf is not installed (the caller records "not checked")."""
    readelf = shutil.which("readelf")
    if not readelf:
        return None
    dyn = subprocess.run([readelf, "-d", "-W", str(so)], capture_output=True, text=True, check=True).stdout
    syms = subprocess.run([readelf, "--dyn-syms", "-W", str(so)], capture_output=True, text=True, check=True).stdout
    exported = set()
    for line in syms.splitlines():
        f = line.split()
        # Num: Value Size Type Bind Vis Ndx Name
        if len(f) >= 8 and f[4] in ("GLOBAL", "WEAK", "UNIQUE") and f[6] != "UND":
            name = f[7].split("@")[0]
            if name.startswith(("_ZNSt", "_ZNKSt", "_ZSt", "_ZTVSt", "_ZTISt", "_ZTSSt")):
                exported.add(name)
    return {
        "needs_libstdcxx": "libstdc++.so" in dyn,
        "exported_std_symbols": len(exported),
        "exports_locale_id": LOCALE_ID in exported,
    }


def check_private_libstdcxx(so: Path) -> dict:
    """Raise BuildError when `so` links libstdc++ statically and exports its locale machinery.

    Returns the exposure dict (or {"checked": False} without readelf) for the build manifest.
    """
    info = libstdcxx_exposure(so)
    if info is None:
        return {"checked": False, "why": "readelf not found"}
    if not info["needs_libstdcxx"] and info["exports_locale_id"]:
        raise BuildError(
            f"{so}: links libstdc++ statically and exports {info['exported_std_symbols']} std:: symbols "
            f"(std::locale::id::_M_id among them); next to torch's shared libstdc++ the locale facets get mixed "
            f"(SIGSEGV in std::regex). Link with -Wl,--exclude-libs,ALL (kernels/deepep.yaml LDFLAGS) or a "
            f"compiler that links libstdc++.so.6"
        )
    return {"checked": True, **info}
