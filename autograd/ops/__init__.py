"""Every differentiable op, registered once as a Function with its forward and VJP side by side."""
