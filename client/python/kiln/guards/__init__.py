"""Where captured values come from (sources) and the guards recorded on them."""
