"""Families that move rows or columns by index or offset rather than compute on them: token/position embedding
(gather and scatter-add) and the column-block copies of concat and its VJP."""
