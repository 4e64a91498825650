#!/usr/bin/env python3
"""Verify a Zopu history bundle (`zopu audit export`) without Zopu.

Usage: python3 verify.py BUNDLE_DIR [--quiet]

Checks, with the Python standard library only:
  1. history.jsonl is the file the manifest describes (its SHA-256 and size);
  2. every event's hash is the SHA-256 of its fields, as the contract
     defines it (zopu_schema::Envelope::hash; README.md here): each field's length
     as 8 big-endian bytes, then its bytes, in this order: id, source, type,
     time, dataschema, org, project, correlation, causation, work, thread,
     flow_run, dispatch, traceparent, idempotency_key, version (8 bytes,
     big-endian), previous_hash (32 bytes, or none for a project's first
     event), data;
  3. every project's chain: versions 1, 2, 3, ... in stream order, each
     event's previous_hash the hash of the event before it;
  4. every project's last event is the head the manifest records.
Then prints the timeline. With the `protobuf` package installed, each
event's payload is decoded from descriptors.pb (the proto files' compiled
descriptor set, also shipped as proto/); without it, its size is shown.

Exit code 0: the bundle verifies. 1: it does not (each finding names the
event's sequence and id). 2: the bundle cannot be read.
"""

import base64
import hashlib
import json
import os
import struct
import sys

FIELDS = [
    "id", "source", "type", "time", "dataschema", "org", "project",
    "correlation", "causation", "work", "thread", "flow_run", "dispatch",
    "traceparent", "idempotency_key",
]


def event_hash(event):
    digest = hashlib.sha256()

    def field(value):
        digest.update(struct.pack(">Q", len(value)))
        digest.update(value)

    for name in FIELDS:
        field((event.get(name) or "").encode("utf-8"))
    field(struct.pack(">Q", event["version"]))
    previous = event.get("previous_hash")
    field(bytes.fromhex(previous) if previous else b"")
    field(base64.b64decode(event["data"]))
    return digest.hexdigest()


def payload_decoder(bundle):
    """A function decoding (message name, bytes) to text, or None."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, json_format
        from google.protobuf import message_factory
    except ImportError:
        return None
    path = os.path.join(bundle, "descriptors.pb")
    if not os.path.exists(path):
        return None
    with open(path, "rb") as handle:
        files = descriptor_pb2.FileDescriptorSet.FromString(handle.read())
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)

    def decode(name, data):
        try:
            descriptor = pool.FindMessageTypeByName(name)
        except KeyError:
            return "(unknown message %s)" % name
        if hasattr(message_factory, "GetMessageClass"):
            cls = message_factory.GetMessageClass(descriptor)
        else:
            cls = message_factory.MessageFactory(pool).GetPrototype(descriptor)
        message = cls.FromString(data)
        return json.dumps(json_format.MessageToDict(message), sort_keys=True)

    return decode


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    bundle, quiet = argv[1], "--quiet" in argv[2:]
    try:
        with open(os.path.join(bundle, "manifest.json"), encoding="utf-8") as handle:
            manifest = json.load(handle)
        with open(os.path.join(bundle, "history.jsonl"), "rb") as handle:
            raw = handle.read()
    except (OSError, ValueError) as error:
        print("cannot read the bundle: %s" % error, file=sys.stderr)
        return 2

    findings = []
    if hashlib.sha256(raw).hexdigest() != manifest["events_sha256"]:
        findings.append("history.jsonl: its SHA-256 is not the manifest's (the file was changed)")
    if len(raw) != manifest["events_bytes"]:
        findings.append("history.jsonl: %d bytes, the manifest says %d" % (len(raw), manifest["events_bytes"]))

    heads = {}
    events = []
    for number, line in enumerate(raw.splitlines(), start=1):
        try:
            event = json.loads(line)
            event["version"] = int(event["version"])
        except (ValueError, KeyError, TypeError) as error:
            findings.append("history.jsonl line %d: not an event (%s)" % (number, error))
            continue
        where = "#%s %s" % (event.get("sequence"), event.get("id"))
        try:
            computed = event_hash(event)
        except (ValueError, KeyError, TypeError) as error:
            findings.append("%s: cannot be hashed (%s)" % (where, error))
            continue
        if computed != event.get("hash"):
            findings.append("%s: its fields hash to %s, not to the recorded %s (altered)"
                            % (where, computed, event.get("hash")))
        key = (event.get("org"), event.get("project"))
        head = heads.get(key)
        expected_version = head[0] + 1 if head else 1
        expected_previous = head[1] if head else None
        if event["version"] != expected_version:
            findings.append("%s: version %d where %d was next (a gap, a reorder or a fork)"
                            % (where, event["version"], expected_version))
        if (event.get("previous_hash") or None) != expected_previous:
            findings.append("%s: its previous hash is not the hash of the project's event before it"
                            % where)
        heads[key] = (event["version"], computed)
        events.append(event)

    for recorded in manifest.get("heads", []):
        key = (recorded["org"], recorded["project"])
        actual = heads.get(key)
        if actual is None:
            findings.append("project %s/%s: in the manifest, not in history.jsonl" % key)
        elif actual != (recorded["version"], recorded["hash"]):
            findings.append("project %s/%s: ends at version %d (%s), the manifest's head is version %d (%s)"
                            % (key[0], key[1], actual[0], actual[1], recorded["version"], recorded["hash"]))
    if len(events) != manifest.get("events", len(events)):
        findings.append("history.jsonl holds %d events, the manifest says %d" % (len(events), manifest["events"]))

    if not quiet:
        decode = payload_decoder(bundle)
        if decode is None:
            print("(payloads shown by size: install `protobuf` to decode them)")
        for event in events:
            data = base64.b64decode(event["data"])
            payload = decode(event["dataschema"], data) if decode else "%d bytes" % len(data)
            print("#%-6s v%-4s %s  %-34s %-22s %s" % (event["sequence"], event["version"], event["time"],
                                                     event["type"], event["source"], payload))
    for finding in findings:
        print("FINDING: %s" % finding)
    if findings:
        print("NOT VERIFIED: %d finding(s) in %d events" % (len(findings), len(events)))
        return 1
    print("verified: %d events, %d project(s), every chain intact and ending at the manifest's heads"
          % (len(events), len(heads)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
