#include "life_common.hpp"
