"""Generate the Infoblox CRDs under crds/ (InfobloxInstance, InfobloxIPPool; the output is committed).

Run `.venv/bin/python hack/gen_infoblox_crds.py`. Version v1alpha1: these kinds are this project's own API, new and
still allowed to change without a conversion path. They are not wire-compatible with the kinds of the same names of
telekom/cluster-api-ipam-provider-infoblox (different fields), and the two providers cannot be installed together.
Validation is OpenAPI plus CEL (isIP, isCIDR, cidr(), ip()) so mistakes are refused at admission with a message.
The spec schemas come from the models in backends/infoblox/spec.py.
"""

from __future__ import annotations

import sys

from crdgen import GROUP, Schema, age_column, conditions, crd, document, model_schema, ready_columns, string, write

from backends.infoblox.spec import VERSION, InstanceSpec, PoolSpec

CONDITIONS = "conditions of the object; Ready says whether it can be used, and if not, why."


def instance_schema() -> Schema:
    status = {
        "description": "InfobloxInstanceStatus is what the provider last saw of the grid.",
        "type": "object",
        "properties": {"conditions": conditions(CONDITIONS)},
    }
    return document(
        "InfobloxInstance is one Infoblox NIOS grid that InfobloxIPPools allocate from.",
        model_schema(InstanceSpec),
        status,
    )


def pool_schema() -> Schema:
    count = {"type": "integer", "format": "int64"}
    status = {
        "description": "InfobloxIPPoolStatus is what the provider last saw of the pool.",
        "type": "object",
        "properties": {
            "ipAddresses": {
                "description": "ipAddresses counts the pool's addresses.",
                "type": "object",
                "properties": {
                    "total": {**count, "description": "total is what the subnets and ranges can hand out."},
                    "used": {**count, "description": "used is the number of IPAddresses of the pool."},
                    "free": {**count, "description": "free is total minus used (others' grid objects not counted)."},
                },
            },
            "networkView": string("networkView is the network view in use.", 64),
            "conditions": conditions(CONDITIONS),
        },
    }
    return document(
        "InfobloxIPPool hands out addresses of Infoblox networks to IPAddressClaims.", model_schema(PoolSpec), status
    )


def main() -> int:
    instance_columns = [
        {"name": "Host", "type": "string", "jsonPath": ".spec.host", "description": "Grid Master"},
        {"name": "WAPI", "type": "string", "jsonPath": ".spec.wapiVersion", "description": "WAPI version"},
    ]
    pool_columns = [
        {"name": "Instance", "type": "string", "jsonPath": ".spec.instanceRef.name", "description": "Grid"},
        {"name": "View", "type": "string", "jsonPath": ".status.networkView", "description": "Network view"},
        {"name": "Mode", "type": "string", "jsonPath": ".spec.mode", "description": "fixedAddress or hostRecord"},
        {"name": "Total", "type": "integer", "jsonPath": ".status.ipAddresses.total", "description": "Addresses"},
        {"name": "Free", "type": "integer", "jsonPath": ".status.ipAddresses.free", "description": "Unallocated"},
        {"name": "Used", "type": "integer", "jsonPath": ".status.ipAddresses.used", "description": "Allocated"},
    ]
    documents = {
        f"{GROUP}_infobloxinstances.yaml": crd(
            kind="InfobloxInstance",
            plural="infobloxinstances",
            scope="Cluster",
            schema=instance_schema(),
            columns=[*instance_columns, *ready_columns(), age_column()],
            version=VERSION,
            # Copied to the target (and left at the source, being cluster-scoped), with anything it owns.
            move="hierarchy",
        ),
        f"{GROUP}_infobloxippools.yaml": crd(
            kind="InfobloxIPPool",
            plural="infobloxippools",
            scope="Namespaced",
            schema=pool_schema(),
            columns=[*pool_columns, *ready_columns(), age_column()],
            version=VERSION,
            move="hierarchy",
        ),
    }
    write(documents, "hack/gen_infoblox_crds.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
