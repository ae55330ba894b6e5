"""The fields each simulated WAPI object type has.

Contract:

* :data:`SCHEMAS` maps each supported object type to an :class:`ObjectSchema`: its basic fields (returned when
  no ``_return_fields`` is given), its required fields, and per field a :class:`Field` saying the value kind,
  whether it is searchable, read-only, create-only, or search-only, and the value reported when it is unset;
* which searchable fields may be changed by PUT follows the WAPI 2.12 schema (as infoblox-client's generated
  ``_updateable_search_fields`` record it): e.g. a fixed address or range may move to another network view,
  a host record to another DNS view, but a ``network`` may not change its ``network_view``;
* fields not listed are unknown: writing, searching or returning them is refused with
  ``Unknown argument/field``.  Listed fields without special meaning in the simulator are stored verbatim
  after their value kind is checked;
* ``view`` (DNS view) and ``zone_auth`` (authoritative zone) are read-only over WAPI (see :mod:`.api`); their
  fields are the ones the simulator keeps, and they are seeded through :class:`~.state.SimulatorState`;
* value kinds and their checks live in :mod:`.fields`.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import errors
from .fields import Field


@dataclass(frozen=True)
class ObjectSchema:
    """The shape of one WAPI object type."""

    name: str
    basic: tuple[str, ...]
    required: tuple[str, ...]
    fields: dict[str, Field]

    def field(self, name: str) -> Field:
        """The field ``name``; refuses unknown names with ``Unknown argument/field``."""
        found = self.fields.get(name)
        if found is None:
            raise errors.unknown_field(name)
        return found


def _s(kind: str = "str") -> Field:
    return Field(kind, searchable=True)


def _ro(kind: str = "any", searchable: bool = False) -> Field:
    return Field(kind, readonly=True, searchable=searchable)


def _plain(names: str, kind: str) -> dict[str, Field]:
    return {name: Field(kind) for name in names.split()}


_VIEW = Field("str", searchable=True, default="default")
_FIXED_VIEW = Field("str", searchable=True, create_only=True, default="default")
_DEVICE = {name: _s() for name in ["device_description", "device_location", "device_type", "device_vendor"]}
_COMMON = {"comment": _s(), "extattrs": Field("extattrs"), "disable": Field("bool", default=False)}
_DHCP_USE = _plain(
    "use_options use_bootfile use_bootserver use_nextserver use_deny_bootp use_pxe_lease_time "
    "use_enable_ddns use_ddns_domainname deny_bootp enable_ddns enable_pxe_lease_time restart_if_needed",
    "bool",
)
_DHCP_MISC = {
    **_plain("bootfile bootserver nextserver ddns_domainname template", "str"),
    "options": Field("list"),
    "pxe_lease_time": Field("uint"),
}
_DISCOVERY = _plain("allow_telnet disable_discovery enable_immediate_discovery", "bool")
_NETWORK_COMMON = {
    **_COMMON,
    **_DHCP_USE,
    **_DHCP_MISC,
    **_DISCOVERY,
    "network_view": _VIEW,
    "network_container": _ro("str", searchable=True),
    "unmanaged": Field("bool", searchable=True),
    "members": Field("list"),
    "zone_associations": Field("list"),
    "use_zone_associations": Field("bool"),
    "auto_create_reversezone": Field("bool", create_only=True),
    "recycle_leases": Field("bool"),
    "use_recycle_leases": Field("bool"),
    "email_list": Field("strlist"),
    "use_email_list": Field("bool"),
    "vlans": Field("list"),
    "cloud_info": _ro(),
    "contains_address": Field("str", search_only=True),
}

_HOST_ADDR_COMMON = {
    "configure_for_dhcp": Field("bool", default=False),
    "use_for_ea_inheritance": Field("bool"),
    "options": Field("list"),
    "use_options": Field("bool"),
    "match_client": Field("str"),
    "reserved_interface": Field("str"),
    "_ref": _ro("str"),
    "host": _ro("str"),
    "network": _ro("str"),
    "network_view": _ro("str"),
    "discovered_data": _ro(),
    "ms_ad_user_data": _ro(),
    "last_queried": _ro("int"),
}

HOST_IPV4ADDR_FIELDS: dict[str, Field] = {
    **_HOST_ADDR_COMMON,
    **_DHCP_MISC,
    **_DHCP_USE,
    "ipv4addr": Field("ipv4"),
    "mac": Field("mac"),
    "is_invalid_mac": _ro("bool"),
    "ignore_client_requested_options": Field("bool"),
    "use_ignore_client_requested_options": Field("bool"),
}
"""Sub-fields of one ``record:host`` ``ipv4addrs[]`` entry (``record:host_ipv4addr``)."""

HOST_IPV6ADDR_FIELDS: dict[str, Field] = {
    **_HOST_ADDR_COMMON,
    "ipv6addr": Field("ipv6"),
    "duid": Field("str"),
    "address_type": Field("enum", default="ADDRESS", choices=("ADDRESS", "PREFIX", "BOTH")),
    "ipv6prefix": Field("str"),
    "ipv6prefix_bits": Field("uint"),
    **_plain("domain_name", "str"),
    "domain_name_servers": Field("strlist"),
    **_plain("preferred_lifetime valid_lifetime", "uint"),
    **_plain("use_domain_name use_domain_name_servers use_preferred_lifetime use_valid_lifetime", "bool"),
}
"""Sub-fields of one ``record:host`` ``ipv6addrs[]`` entry (``record:host_ipv6addr``)."""

HOST_ADDR_BASIC = {
    4: ("configure_for_dhcp", "host", "ipv4addr", "mac"),
    6: ("configure_for_dhcp", "duid", "host", "ipv6addr"),
}
"""Basic fields of host address sub-objects; other fields are shown only with ``configure_for_dhcp``."""

_MATCH_CLIENT = ("MAC_ADDRESS", "CLIENT_ID", "RESERVED", "CIRCUIT_ID", "REMOTE_ID")

SCHEMAS: dict[str, ObjectSchema] = {
    "networkview": ObjectSchema(
        "networkview",
        basic=("comment", "is_default", "name"),
        required=("name",),
        fields={
            "name": _s(),
            "comment": _s(),
            "extattrs": Field("extattrs"),
            "is_default": Field("bool", readonly=True, searchable=True, default=False),
            "associated_dns_views": _ro("strlist"),
            "associated_members": _ro(),
            "cloud_info": _ro(),
            "mgm_private": Field("bool"),
            "ddns_dns_view": Field("str"),
            "ddns_zone_primaries": Field("list"),
            "internal_forward_zones": Field("list"),
            "remote_forward_zones": Field("list"),
            "remote_reverse_zones": Field("list"),
        },
    ),
    "network": ObjectSchema(
        "network",
        basic=("comment", "network", "network_view"),
        required=("network",),
        fields={
            **_NETWORK_COMMON,
            "network": Field("cidr4", searchable=True),
            "network_view": _FIXED_VIEW,
            "ipv4addr": _ro("ipv4", searchable=True),
            "netmask": _ro("uint"),
            "authority": Field("bool"),
            "use_authority": Field("bool"),
            "lease_scavenge_time": Field("int"),
            "use_lease_scavenge_time": Field("bool"),
            "high_water_mark": Field("uint"),
            "low_water_mark": Field("uint"),
            "enable_discovery": Field("bool"),
            "total_hosts": _ro("uint"),
            "utilization": _ro("uint"),
            "dhcp_utilization": _ro("uint"),
        },
    ),
    "ipv6network": ObjectSchema(
        "ipv6network",
        basic=("comment", "network", "network_view"),
        required=("network",),
        fields={
            **_NETWORK_COMMON,
            "network": Field("cidr6", searchable=True),
            **_plain("domain_name", "str"),
            "domain_name_servers": Field("strlist"),
            **_plain("preferred_lifetime valid_lifetime", "uint"),
            **_plain("use_domain_name use_domain_name_servers use_preferred_lifetime use_valid_lifetime", "bool"),
        },
    ),
    "fixedaddress": ObjectSchema(
        "fixedaddress",
        basic=("ipv4addr", "network_view"),
        required=("ipv4addr",),
        fields={
            **_COMMON,
            **_DHCP_USE,
            **_DHCP_MISC,
            **_DEVICE,
            **_DISCOVERY,
            "ipv4addr": _s("ipv4"),
            "mac": _s("mac"),
            "match_client": Field("enum", searchable=True, default="MAC_ADDRESS", choices=_MATCH_CLIENT),
            "network": Field("cidr4", searchable=True),
            "network_view": _VIEW,
            "name": Field("str"),
            "dhcp_client_identifier": Field("str"),
            "agent_circuit_id": Field("str"),
            "agent_remote_id": Field("str"),
            "client_identifier_prepend_zero": Field("bool"),
            "ddns_hostname": Field("str"),
            "always_update_dns": Field("bool"),
            "reserved_interface": Field("str"),
            "ms_server": Field("dict", searchable=True),
            "ms_options": Field("list"),
            "use_ms_options": Field("bool"),
            "is_invalid_mac": _ro("bool"),
            "cloud_info": _ro(),
            "discovered_data": _ro(),
        },
    ),
    "ipv6fixedaddress": ObjectSchema(
        "ipv6fixedaddress",
        basic=("duid", "ipv6addr", "network_view"),
        required=("ipv6addr", "duid"),
        fields={
            **_COMMON,
            **_DEVICE,
            **_DISCOVERY,
            "ipv6addr": _s("ipv6"),
            "duid": _s(),
            "address_type": Field("enum", searchable=True, default="ADDRESS", choices=("ADDRESS", "PREFIX", "BOTH")),
            "ipv6prefix": _s(),
            "ipv6prefix_bits": _s("uint"),
            "network": Field("cidr6", searchable=True),
            "network_view": _VIEW,
            "name": Field("str"),
            "options": Field("list"),
            "use_options": Field("bool"),
            "template": Field("str"),
            "restart_if_needed": Field("bool"),
            "reserved_interface": Field("str"),
            **_plain("domain_name", "str"),
            "domain_name_servers": Field("strlist"),
            **_plain("preferred_lifetime valid_lifetime", "uint"),
            **_plain("use_domain_name use_domain_name_servers use_preferred_lifetime use_valid_lifetime", "bool"),
            "cloud_info": _ro(),
            "discovered_data": _ro(),
        },
    ),
    "record:host": ObjectSchema(
        "record:host",
        basic=("ipv4addrs", "ipv6addrs", "name", "view"),
        required=("name",),
        fields={
            **_COMMON,
            **_DEVICE,
            **_DISCOVERY,
            "name": _s(),
            "view": _VIEW,
            "zone": _ro("str", searchable=True),
            "ipv4addrs": Field("hostaddrs4"),
            "ipv6addrs": Field("hostaddrs6"),
            "aliases": Field("strlist"),
            "configure_for_dns": Field("bool", default=True),
            "ttl": Field("uint"),
            "use_ttl": Field("bool"),
            "ddns_protected": Field("bool"),
            "rrset_order": Field("str"),
            "restart_if_needed": Field("bool"),
            "network_view": Field("str", searchable=True, create_only=True),
            "dns_name": _ro("str"),
            "dns_aliases": _ro("strlist"),
            "creation_time": _ro("int"),
            "last_queried": _ro("int"),
            "cloud_info": _ro(),
            "ms_ad_user_data": _ro(),
            "ipv4addr": Field("ipv4", search_only=True),
            "ipv6addr": Field("ipv6", search_only=True),
            "mac": Field("mac", search_only=True),
        },
    ),
    "extensibleattributedef": ObjectSchema(
        "extensibleattributedef",
        basic=("comment", "default_value", "name", "type"),
        required=("name", "type"),
        fields={
            "name": _s(),
            "type": Field(
                "enum",
                searchable=True,
                choices=("STRING", "INTEGER", "EMAIL", "URL", "DATE", "ENUM"),
            ),
            "comment": _s(),
            "default_value": Field("any"),
            "flags": Field("str"),
            "list_values": Field("list"),
            "max": Field("int"),
            "min": Field("int"),
            "namespace": Field("str", readonly=True, searchable=True, default="default"),
            "allowed_object_types": Field("strlist"),
            "descendants_action": Field("dict"),
        },
    ),
    "range": ObjectSchema(
        "range",
        basic=("comment", "end_addr", "network", "network_view", "start_addr"),
        required=("start_addr", "end_addr"),
        fields={
            **_COMMON,
            **_DHCP_USE,
            **_DHCP_MISC,
            "start_addr": _s("ipv4"),
            "end_addr": _s("ipv4"),
            "network": Field("cidr4", searchable=True),
            "network_view": _VIEW,
            "name": Field("str"),
            "exclude": Field("list"),
            "member": Field("dict", searchable=True),
            "failover_association": _s(),
            "server_association_type": Field(
                "enum",
                searchable=True,
                default="NONE",
                choices=("NONE", "MEMBER", "FAILOVER", "MS_SERVER", "MS_FAILOVER"),
            ),
            "ms_server": Field("dict", searchable=True),
            "always_update_dns": Field("bool"),
            "deny_all_clients": Field("bool"),
            "known_clients": Field("str"),
            "unknown_clients": Field("str"),
            "recycle_leases": Field("bool"),
            "use_recycle_leases": Field("bool"),
            "email_list": Field("strlist"),
            "use_email_list": Field("bool"),
            "high_water_mark": Field("uint"),
            "low_water_mark": Field("uint"),
            "total_hosts": _ro("uint"),
            "dhcp_utilization": _ro("uint"),
            "cloud_info": _ro(),
        },
    ),
    "view": ObjectSchema(
        "view",
        basic=("comment", "is_default", "name"),
        required=("name",),
        fields={
            "name": _s(),
            "comment": _s(),
            "network_view": Field("str", searchable=True, create_only=True, default="default"),
            "is_default": Field("bool", readonly=True, searchable=True, default=False),
            "extattrs": Field("extattrs"),
            "disable": Field("bool", default=False),
        },
    ),
    "zone_auth": ObjectSchema(
        "zone_auth",
        basic=("fqdn", "view"),
        required=("fqdn",),
        fields={
            "fqdn": Field("str", searchable=True, create_only=True),
            "view": Field("str", searchable=True, create_only=True, default="default"),
            "comment": _s(),
            "extattrs": Field("extattrs"),
            "disable": Field("bool", default=False),
        },
    ),
}
