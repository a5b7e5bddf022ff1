// A shared library that is not a trainyard plugin.

extern "C" __attribute__((visibility("default"))) int not_a_plugin() { return 42; }
