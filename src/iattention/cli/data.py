"""`iattn data`: the data folder remembered for the user (`remember DIR`, `forget`, `where`)."""

from __future__ import annotations

import os

from iattention.cli.args import out_path
from iattention.data.remember import config_file, forget_data_dir, remember_data_dir, remembered_data_dir
from iattention.errors import UserError


def cmd_data(args) -> None:
    if args.action == "remember":
        if not args.folder:

            raise UserError("iattn data remember needs the folder: iattn data remember DIR")
        path = remember_data_dir(args.folder)
        print(f"remembered data folder {remembered_data_dir()} in {path}")
    elif args.action == "forget":
        print(f"forgot the data folder in {config_file()}" if forget_data_dir() else "no data folder was remembered")
    else:
        env = os.environ.get("IATTN_DATA_DIR")
        remembered = remembered_data_dir()
        if env:
            print(f"{env} (from IATTN_DATA_DIR)")
        elif remembered:
            print(f"{remembered} (remembered in {config_file()})")
        else:
            print("none: pass --data-dir DIR, set IATTN_DATA_DIR, run `iattn data remember DIR`, or pip install "
                  "\"iattention[data]\" to download WikiText-2")


def register(sub) -> None:
    p = sub.add_parser("data", help="remember the data folder for every later command (like HF_HOME)",
                       description="Remember a data folder (holding wikitext-2-v1/ and tokenizers/) for this user, "
                                   "in $XDG_CONFIG_HOME/iattention/config.json (default ~/.config/iattention/). "
                                   "Commands look for data in: --data-dir, $IATTN_DATA_DIR, the folder a run "
                                   "recorded (commands on a run), the remembered folder, then a download "
                                   "(pip install \"iattention[data]\"). `make demo` remembers the folder it used.")
    p.add_argument("action", choices=("remember", "forget", "where"),
                   help="remember DIR; forget it; where: print the folder a command would use")
    # out_path: a path a message can name (UTF-8, no newline or other control character), as --out is
    p.add_argument("folder", nargs="?", type=out_path, help="the data folder (for remember)")
    p.set_defaults(func=cmd_data)
