/* placeholder: the page script is being written */
