"""L3, the recipe: which dataset indices batch ``b`` of epoch ``e`` reads on rank ``r``, and its changes during a run."""
