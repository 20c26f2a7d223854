"""Drives a simulated BMC with OpenStack's sushy, as a second real Redfish client.

Usage: sushy_drive.py --url URL --user USER --password PASSWORD --ca CA.pem
                      --iso ISO_URL --uuid SMBIOS_UUID

Reads the system (its UUID must be the machine's), powers it off and waits for `Off`, sets a
one-time boot override to the CD, inserts the ISO into the manager's virtual CD, powers the
system on and waits for `On`, checks that the boot consumed the override, and leaves the ISO
inserted. Exits non-zero, saying why, on the first thing that is not as expected.
"""

import argparse
import sys
import time

import sushy

WAIT_SECONDS = 10


def wait_for(what, check):
    """Polls `check` until it holds; fails after WAIT_SECONDS."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        if check():
            return
        if time.monotonic() > deadline:
            sys.exit(f"timed out waiting for {what}")
        time.sleep(0.05)


def power_is(system, state):
    system.refresh(force=True)
    return system.power_state == state


def main():
    parser = argparse.ArgumentParser()
    for flag in ("--url", "--user", "--password", "--ca", "--iso", "--uuid"):
        parser.add_argument(flag, required=True)
    args = parser.parse_args()

    root = sushy.Sushy(args.url, username=args.user, password=args.password, verify=args.ca)
    system = root.get_system()
    if system.uuid.lower() != args.uuid.lower():
        sys.exit(f"the system reports UUID {system.uuid}, the machine's is {args.uuid}")
    if system.power_state != sushy.PowerState.ON:
        sys.exit(f"the system starts {system.power_state}, not on")
    resets = system.get_allowed_reset_system_values()
    for wanted in (sushy.ResetType.ON, sushy.ResetType.FORCE_OFF, sushy.ResetType.FORCE_RESTART):
        if wanted not in resets:
            sys.exit(f"{wanted} is not an allowed reset: {resets}")

    system.reset_system(sushy.ResetType.FORCE_OFF)
    wait_for("power off", lambda: power_is(system, sushy.PowerState.OFF))

    system.refresh(force=True)
    if sushy.BootSource.CD not in system.get_allowed_system_boot_source_values():
        sys.exit("the CD is not an allowed boot source")
    system.set_system_boot_options(
        target=sushy.BootSource.CD, enabled=sushy.BootSourceOverrideEnabled.ONCE
    )
    system.refresh(force=True)
    if system.boot.enabled != sushy.BootSourceOverrideEnabled.ONCE:
        sys.exit(f"the override reads {system.boot.enabled}, not once")

    manager = root.get_manager()
    cd = manager.virtual_media.get_member(manager.virtual_media.members_identities[0])
    if sushy.VirtualMediaType.CD not in cd.media_types:
        sys.exit(f"the virtual media is not a CD: {cd.media_types}")
    cd.insert_media(args.iso, inserted=True, write_protected=True)
    cd.refresh(force=True)
    if not cd.inserted or cd.image != args.iso:
        sys.exit(f"the CD holds {cd.image!r}, inserted={cd.inserted}")

    system.reset_system(sushy.ResetType.ON)
    wait_for("power on", lambda: power_is(system, sushy.PowerState.ON))
    if system.boot.enabled != sushy.BootSourceOverrideEnabled.DISABLED:
        sys.exit(f"the one-time override was not consumed: {system.boot.enabled}")
    print("sushy: read, powered off, set a one-time CD boot, inserted the ISO, powered on")


if __name__ == "__main__":
    main()
