"""Fleet tools for operators and demos: an embedded MQTT broker and a live view of the fleet."""
