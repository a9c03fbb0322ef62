"""Bridges: other messaging systems' clients reaching Veil through a process of their own, as a
client of Veil like any other (MQTT: `veil bridge mqtt`)."""
