#pragma once
// Declarations only; see gloo_api/README.md.
#include "gloo/rendezvous/store.h"
